// The paged, batched CPU forward against a naive dense reference (double
// precision, one sequence at a time, no cache) on random-weight models:
// MHA, GQA (ratios 3, 4, 8), MQA; block sizes 1, 16, 32; shuffled block
// tables; prefill chunks and decode tokens mixed in one batch.
#include <algorithm>
#include <numeric>
#include <random>

#include "engine/runner/kv_cache_storage.h"
#include "gtest/gtest.h"
#include "models/cpu/cpu_llama_model.h"
#include "scheduler/request.h"
#include "tests/support/random_model.h"

namespace kvserve::models {
namespace {

using testing::DenseReference;
using testing::RandomWeights;
using testing::SmallConfig;

double RelErr(const float* got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// Drives several sequences through one model with shuffled block tables.
class MultiSeqDriver {
 public:
  MultiSeqDriver(CpuLlamaModel* model, engine::KvCacheStorage* kv,
                 std::vector<std::vector<int32_t>> seqs, uint32_t seed)
      : model_(model), kv_(kv), seqs_(std::move(seqs)), done_(seqs_.size()) {
    std::vector<int32_t> pool(kv->num_blocks());
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), std::mt19937(seed));
    const int32_t bs = kv->block_size();
    size_t next = 0;
    for (const auto& s : seqs_) {
      const size_t nb = (s.size() + bs - 1) / bs;
      tables_.emplace_back(pool.begin() + next, pool.begin() + next + nb);
      next += nb;
      max_blocks_ = std::max<int32_t>(max_blocks_, nb);
    }
    EXPECT_LE(next, pool.size()) << "test pool too small";
  }

  // One step: (sequence, new tokens) pairs; logits for every sequence's
  // last token in the step, returned with (sequence, position) labels.
  struct Row {
    int seq;
    int pos;
  };
  std::vector<Row> Step(const std::vector<std::pair<int, int>>& plan,
                        std::vector<float>* logits) {
    ForwardBatch b;
    b.max_blocks_per_seq = max_blocks_;
    b.seq_starts = {0};
    std::vector<Row> rows;
    const int32_t bs = kv_->block_size();
    for (auto [s, n] : plan) {
      for (int j = 0; j < n; ++j) {
        const int pos = done_[s] + j;
        b.token_ids.push_back(seqs_[s][pos]);
        b.positions.push_back(pos);
        b.slot_mapping.push_back(tables_[s][pos / bs] * bs + pos % bs);
      }
      done_[s] += n;
      b.seq_starts.push_back(b.token_ids.size());
      b.context_lens.push_back(done_[s]);
      std::vector<int32_t> row(max_blocks_, 0);
      std::copy(tables_[s].begin(), tables_[s].end(), row.begin());
      b.block_tables.insert(b.block_tables.end(), row.begin(), row.end());
      b.logits_rows.push_back(b.token_ids.size() - 1);
      rows.push_back({s, done_[s] - 1});
    }
    absl::Status st = model_->Forward(b, kv_->view(), logits);
    EXPECT_TRUE(st.ok()) << st;
    return rows;
  }
  const std::vector<int32_t>& table(int s) const { return tables_[s]; }

 private:
  CpuLlamaModel* model_;
  engine::KvCacheStorage* kv_;
  std::vector<std::vector<int32_t>> seqs_;
  std::vector<int> done_;
  std::vector<std::vector<int32_t>> tables_;
  int32_t max_blocks_ = 0;
};

struct Case {
  int heads, kv_heads, block_size;
  bool bias = false;
  RopeStyle style = RopeStyle::kInterleaved;
  int window = 0;
};

class PagedForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(PagedForwardTest, MixedBatchesMatchDenseReference) {
  const Case& p = GetParam();
  ModelConfig c = SmallConfig(p.heads, p.kv_heads, p.bias, p.style);
  c.sliding_window = p.window;
  auto model = CpuLlamaModel::Create(c, RandomWeights(c, 7));
  ASSERT_TRUE(model.ok()) << model.status();
  auto ref_weights = RandomWeights(c, 7);
  DenseReference ref(c, *ref_weights);

  std::mt19937 rng(p.heads * 100 + p.kv_heads * 10 + p.block_size);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  const std::vector<int> lens = {41, 9, 26, 57};
  std::vector<std::vector<int32_t>> seqs;
  for (int len : lens) {
    seqs.emplace_back(len);
    for (auto& t : seqs.back()) t = tok(rng);
  }
  std::vector<std::vector<std::vector<double>>> want;
  for (const auto& s : seqs) want.push_back(ref.Logits(s));

  auto kv = engine::KvCacheStorage::Create({c.num_layers, c.num_kv_heads,
                                            c.head_dim, p.block_size,
                                            /*num_blocks=*/200, 0});
  ASSERT_TRUE(kv.ok()) << kv.status();
  MultiSeqDriver drv(model->get(), kv->get(), seqs, 99);
  // Prefill chunks and decode tokens mixed; every sequence reaches its end.
  const std::vector<std::vector<std::pair<int, int>>> plan = {
      {{0, 20}, {1, 5}},
      {{0, 17}, {1, 1}, {2, 20}},
      {{0, 1}, {1, 1}, {2, 3}, {3, 50}},
      {{3, 1}, {2, 1}, {1, 1}, {0, 1}},
      {{0, 1}, {1, 1}, {2, 1}, {3, 1}},
      {{0, 1}, {3, 5}, {2, 1}},
  };
  std::vector<float> logits;
  int checked = 0;
  for (const auto& step : plan) {
    auto rows = drv.Step(step, &logits);
    for (size_t r = 0; r < rows.size(); ++r) {
      const double err = RelErr(logits.data() + r * c.vocab_size,
                                want[rows[r].seq][rows[r].pos]);
      EXPECT_LE(err, 1e-4) << "seq " << rows[r].seq << " pos " << rows[r].pos;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 20);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedForwardTest,
    ::testing::Values(Case{4, 4, 16}, Case{6, 2, 16}, Case{8, 2, 1},
                      Case{16, 2, 32}, Case{4, 1, 16}, Case{6, 2, 1},
                      Case{8, 2, 32}, Case{4, 1, 32},
                      Case{6, 2, 16, true, RopeStyle::kHalfSplit},
                      Case{8, 2, 16, false, RopeStyle::kInterleaved, 8}),
    [](const auto& info) {
      const Case& c = info.param;
      return absl::StrCat("H", c.heads, "_Hkv", c.kv_heads, "_B", c.block_size,
                          c.bias ? "_bias" : "",
                          c.style == RopeStyle::kHalfSplit ? "_neox" : "",
                          c.window ? "_window" : "");
    });

// A sequence's logits alone equal its logits inside a mixed batch of 8.
TEST(PagedForwardBatchInvariance, AloneEqualsInBatchOfEight) {
  ModelConfig c = SmallConfig(6, 2);
  auto model = CpuLlamaModel::Create(c, RandomWeights(c, 3));
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<std::vector<int32_t>> seqs(8);
  for (int s = 0; s < 8; ++s) {
    seqs[s].resize(20 + 5 * s);
    for (auto& t : seqs[s]) t = tok(rng);
  }
  auto kv_alone = engine::KvCacheStorage::Create(
      {c.num_layers, c.num_kv_heads, c.head_dim, 16, 64, 0});
  auto kv_batch = engine::KvCacheStorage::Create(
      {c.num_layers, c.num_kv_heads, c.head_dim, 16, 64, 0});
  ASSERT_TRUE(kv_alone.ok() && kv_batch.ok());
  MultiSeqDriver alone(model->get(), kv_alone->get(), {seqs[3]}, 1);
  MultiSeqDriver batch(model->get(), kv_batch->get(), seqs, 2);
  std::vector<float> la, lb;
  // Prefill 10 tokens then decode 5, alone and among 7 others.
  for (int step = 0; step < 6; ++step) {
    const int n = step == 0 ? 10 : 1;
    alone.Step({{0, n}}, &la);
    std::vector<std::pair<int, int>> plan;
    for (int s = 0; s < 8; ++s)
      plan.push_back({s, step == 0 ? 10 + (s % 2) : 1});
    plan[3].second = n;
    batch.Step(plan, &lb);
    double num = 0, den = 0;
    for (int v = 0; v < c.vocab_size; ++v) {
      const double d = la[v] - lb[3 * c.vocab_size + v];
      num += d * d;
      den += static_cast<double>(la[v]) * la[v];
    }
    EXPECT_LE(std::sqrt(num / den), 1e-5) << "step " << step;
  }
}

// A bounded KV policy (kv_policy streaming) as the engine runs it: whole
// blocks past the sink block dropped once older than the window, the table
// compacted, new tokens written at KV index position - dropped with RoPE at
// their position (rope_positions), the sink block scored by the query at
// its KV index (sink_lens). Against the dense float64 reference in which
// each token attends the keys that were kept when it was computed, sinks at
// their distance within the cache. `in_cache` false: no sink_lens, sinks at
// their written distance.
void RunWindowedAgainstReference(bool in_cache) {
  ModelConfig c = SmallConfig(6, 2);
  auto model = CpuLlamaModel::Create(c, RandomWeights(c, 11));
  ASSERT_TRUE(model.ok()) << model.status();
  auto ref_weights = RandomWeights(c, 11);
  constexpr int32_t kB = 4, kSinkTokens = 4, kWindow = 8, kLen = 40;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<int32_t> seq(kLen);
  for (auto& t : seq) t = tok(rng);
  auto kv = engine::KvCacheStorage::Create(
      {c.num_layers, c.num_kv_heads, c.head_dim, kB, 64, 0});
  ASSERT_TRUE(kv.ok()) << kv.status();

  std::vector<int32_t> table, free_blocks(64);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937(3));
  std::vector<int32_t> offset_of(kLen, 0);  // dropped when token i ran
  std::vector<std::vector<float>> got;      // last row of each step
  std::vector<int32_t> got_pos;
  int32_t done = 0, dropped = 0;
  while (done < kLen) {
    // The scheduler's rule (one sink block).
    const auto [first, count] = scheduler::BlocksOutOfWindow(
        {.sinks = kSinkTokens, .window = kWindow}, done, dropped, kB);
    if (count > 0) {
      free_blocks.insert(free_blocks.end(), table.begin() + first,
                         table.begin() + first + count);
      table.erase(table.begin() + first, table.begin() + first + count);
      dropped += count * kB;
    }
    const int32_t n = done == 0 ? 10 : 1;
    while (static_cast<int32_t>(table.size()) * kB < done + n - dropped) {
      table.push_back(free_blocks.front());
      free_blocks.erase(free_blocks.begin());
    }
    ForwardBatch b;
    b.max_blocks_per_seq = static_cast<int32_t>(table.size());
    b.block_tables = table;
    b.seq_starts = {0, n};
    b.context_lens = {done + n - dropped};
    for (int32_t j = 0; j < n; ++j) {
      const int32_t pos = done + j, idx = pos - dropped;
      b.token_ids.push_back(seq[pos]);
      b.positions.push_back(idx);
      b.rope_positions.push_back(pos);
      b.slot_mapping.push_back(table[idx / kB] * kB + idx % kB);
      offset_of[pos] = dropped;
    }
    b.logits_rows = {n - 1};
    if (in_cache && dropped > 0) b.sink_lens = {kB};  // the one sink block
    ASSERT_TRUE(b.Validate(64, kB, c.vocab_size).ok());
    std::vector<float> logits;
    ASSERT_TRUE((*model)->Forward(b, kv->get()->view(), &logits).ok());
    got.push_back(logits);
    got_pos.push_back(done + n - 1);
    done += n;
  }
  ASSERT_GT(dropped, 16);
  testing::DenseReference ref(c, *ref_weights);
  ref.set_mask([&](int64_t i, int64_t t) {
    return t < kSinkTokens || t >= kSinkTokens + offset_of[i];
  });
  if (in_cache) {
    ref.set_query_shift([&](int64_t i, int64_t t) -> int64_t {
      return t < kB ? offset_of[i] : 0;
    });
  }
  const auto want = ref.Logits(seq);
  for (size_t k = 0; k < got.size(); ++k) {
    EXPECT_LE(RelErr(got[k].data(), want[got_pos[k]]), 1e-4)
        << "position " << got_pos[k];
  }
}

TEST(PagedForwardKvWindow, SinksAtInCacheDistanceMatchReference) {
  RunWindowedAgainstReference(true);
}

TEST(PagedForwardKvWindow, SinksAtWrittenDistanceMatchReference) {
  RunWindowedAgainstReference(false);
}

}  // namespace
}  // namespace kvserve::models

namespace kvserve::models {
namespace {

// A model whose head_dim holds whole int3/int2 groups (32 elements).
ModelConfig LowBitConfig() {
  ModelConfig c = SmallConfig(2, 1);
  c.head_dim = 32;
  return c;
}
constexpr int kGroupRows = kvcache::kKvKeyGroupTokens;

// int2 keys are quantized per channel over each key group's rows, from the
// exact keys the model stages: a sequence written one token at a time ends
// with layer 0's key pages byte for byte those of one prefill (layer 0's
// keys depend on the tokens alone). A group whose staged keys are lost (a
// block refilled by a swap) is rebuilt from its codes, and counted.
TEST(PagedForwardLowBitKv, KeyGroupsRequantizeFromExactKeys) {
  const ModelConfig c = LowBitConfig();
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<int32_t> seq(80);
  for (auto& t : seq) t = tok(rng);
  struct Run {
    std::unique_ptr<CpuLlamaModel> model;
    std::unique_ptr<engine::KvCacheStorage> kv;
    std::unique_ptr<MultiSeqDriver> drv;
  };
  auto make = [&] {
    Run r;
    r.model = *CpuLlamaModel::Create(c, RandomWeights(c, 5));
    r.kv = *engine::KvCacheStorage::Create({c.num_layers, c.num_kv_heads,
                                            c.head_dim, kGroupRows, 8, 0,
                                            kvcache::KvDtype::kInt2});
    r.drv = std::make_unique<MultiSeqDriver>(
        r.model.get(), r.kv.get(), std::vector<std::vector<int32_t>>{seq}, 3);
    return r;
  };
  Run prefill = make(), decode = make(), lost = make();
  std::vector<float> logits;
  prefill.drv->Step({{0, 80}}, &logits);
  for (int i = 0; i < 80; ++i) {
    decode.drv->Step({{0, 1}}, &logits);
    if (i == kGroupRows + 3) {  // 4 rows into the second group: lost
      lost.model->residual(lost.kv->view())
          .Forget(lost.drv->table(0)[1], kGroupRows);
    }
    lost.drv->Step({{0, 1}}, &logits);
  }
  const KvCacheView& v = prefill.kv->view();
  auto layer0_keys = [&](const Run& r, int b) {
    const std::byte* p =
        r.kv->view().k[0] + r.drv->table(0)[b] * v.BlockBytes();
    return std::vector<std::byte>(p, p + v.BlockBytes());
  };
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(layer0_keys(prefill, b), layer0_keys(decode, b)) << "block " << b;
  }
  EXPECT_EQ(layer0_keys(prefill, 0), layer0_keys(lost, 0));
  EXPECT_EQ(prefill.model->residual(prefill.kv->view()).rebuilt_groups(), 0);
  EXPECT_EQ(decode.model->residual(decode.kv->view()).rebuilt_groups(), 0);
  EXPECT_EQ(lost.model->residual(lost.kv->view()).rebuilt_groups(), 1);
  // Positions 64..79: the third group, partly filled, still staged.
  EXPECT_EQ(decode.model->residual(decode.kv->view()).num_entries(), 1u);
}

// KIVI's residual: attention reads the key groups a forward writes from the
// staged f32 rows, so while a sequence is inside its first group int2 KV
// gives f32 KV's logits (up to the rotation's rounding), decoded one token
// at a time or prefilled at once; once a group is full it is read from its
// codes. Two pools on one model keep separate stages (eval's lanes).
TEST(PagedForwardLowBitKv, NewestGroupReadsFullPrecision) {
  const ModelConfig c = LowBitConfig();
  std::mt19937 rng(12);
  std::uniform_int_distribution<int32_t> tok(0, c.vocab_size - 1);
  std::vector<int32_t> seq(80);
  for (auto& t : seq) t = tok(rng);
  const auto model = *CpuLlamaModel::Create(c, RandomWeights(c, 6));
  auto pool = [&](kvcache::KvDtype dtype) {
    return *engine::KvCacheStorage::Create(
        {c.num_layers, c.num_kv_heads, c.head_dim, kGroupRows, 8, 0, dtype});
  };
  const auto f32 = pool(kvcache::KvDtype::kF32);
  const auto int2 = pool(kvcache::KvDtype::kInt2);
  const auto int3 = pool(kvcache::KvDtype::kInt3);
  MultiSeqDriver ref(model.get(), f32.get(), {seq}, 3);
  MultiSeqDriver low(model.get(), int2.get(), {seq}, 3);
  std::vector<int32_t> other_seq(80);
  for (auto& t : other_seq) t = tok(rng);
  MultiSeqDriver other(model.get(), int3.get(), {other_seq}, 3);
  std::vector<float> want, got, unused;
  double worst_in_group = 0.0, worst_after = 0.0;
  for (int i = 0; i < 80; ++i) {
    ref.Step({{0, 1}}, &want);
    other.Step({{0, 1}}, &unused);  // interleaved, on the same slots
    low.Step({{0, 1}}, &got);
    const double err = RelErr(got.data(), {want.begin(), want.end()});
    double& worst = i < kGroupRows ? worst_in_group : worst_after;
    worst = std::max(worst, err);
  }
  EXPECT_LE(worst_in_group, 1e-4);
  EXPECT_GE(worst_after, 1e-2) << "full groups are read from int2 codes";

  const auto f32b = pool(kvcache::KvDtype::kF32);
  const auto int2b = pool(kvcache::KvDtype::kInt2);
  MultiSeqDriver ref16(model.get(), f32b.get(), {seq}, 5);
  MultiSeqDriver low16(model.get(), int2b.get(), {seq}, 5);
  ref16.Step({{0, kGroupRows}}, &want);
  low16.Step({{0, kGroupRows}}, &got);
  EXPECT_LE(RelErr(got.data(), {want.begin(), want.end()}), 1e-4);
}

}  // namespace
}  // namespace kvserve::models
