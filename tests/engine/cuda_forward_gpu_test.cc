// End to end on the default model (weights/, SmolLM2-135M Q4_1): greedy
// outputs of the CUDA backend on 8 prompts, batched, against the CPU path's
// for the first 16 tokens (equal up to a near tie; see ExpectCloseGreedy).
// Also the backend contract: bf16 KV, block copy and swap round trips keep
// the generated continuation. Skipped without a CUDA device or without the
// model file. Under the SIMT emulator (KVSERVE_CUDA_EMU) the same code runs
// on the CPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

#ifdef KVSERVE_CUDA
#include "engine/runner/cuda_backend.h"
#include "engine/runner/kv_cache_storage.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/model_backend.h"
#include "models/cpu/cpu_llama_model.h"
#include "models/cuda/cuda_llama.h"
#include "models/forward_batch.h"
#include "tests/support/random_model.h"
#include "tests/support/require_gpu.h"

namespace kvserve::engine {
namespace {

constexpr char kModel[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr int kNewTokens = 16;
constexpr int kBlock = 16;

const std::vector<std::string>& Prompts() {
  static const std::vector<std::string> p = {
      "The capital of France is",
      "Once upon a time, in a small village,",
      "def fibonacci(n):",
      "The three primary colors are",
      "Water boils at a temperature of",
      "My favorite book is",
      "1, 2, 3, 4, 5,",
      "Translate to French: good morning ->"};
  return p;
}

int Argmax(const float* row, int n) {
  return static_cast<int>(std::max_element(row, row + n) - row);
}

// The kTopK largest logits' token ids, best first.
constexpr int kTopK = 5;
std::vector<int32_t> TopK(const float* row, int n) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = i;
  std::partial_sort(ids.begin(), ids.begin() + kTopK, ids.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  ids.resize(kTopK);
  return ids;
}

// Greedy decoding of every prompt together through `forward`, each
// sequence in its own contiguous run of blocks starting at its index * span.
// Returns, per prompt and step, the top kTopK tokens (the first is the one
// generated).
using TopTokens = std::vector<std::vector<std::vector<int32_t>>>;
template <typename ForwardFn>
TopTokens Greedy(const std::vector<std::vector<int32_t>>& prompts, int vocab,
                 int span, ForwardFn forward) {
  const int s = static_cast<int>(prompts.size());
  std::vector<std::vector<int32_t>> seq = prompts;
  TopTokens out(s);
  std::vector<int> done(s, 0);
  for (int step = 0; step < kNewTokens; ++step) {
    models::ForwardBatch b;
    b.max_blocks_per_seq = span;
    b.seq_starts = {0};
    for (int i = 0; i < s; ++i) {
      for (size_t p = done[i]; p < seq[i].size(); ++p) {
        b.token_ids.push_back(seq[i][p]);
        b.positions.push_back(static_cast<int32_t>(p));
        b.slot_mapping.push_back(i * span * kBlock + static_cast<int32_t>(p));
      }
      done[i] = static_cast<int>(seq[i].size());
      b.seq_starts.push_back(b.token_ids.size());
      b.context_lens.push_back(done[i]);
      for (int j = 0; j < span; ++j) b.block_tables.push_back(i * span + j);
      b.logits_rows.push_back(b.token_ids.size() - 1);
    }
    std::vector<float> logits;
    if (!forward(b, &logits)) return {};
    for (int i = 0; i < s; ++i) {
      out[i].push_back(TopK(logits.data() + i * vocab, vocab));
      seq[i].push_back(out[i].back()[0]);
    }
  }
  return out;
}

std::vector<int32_t> Tokens(const std::vector<std::vector<int32_t>>& top) {
  std::vector<int32_t> t;
  for (const auto& k : top) t.push_back(k[0]);
  return t;
}

// Two numerics (bf16 on the GPU, int8 activations on the CPU) agree the way
// vLLM's check_logprobs_close asks: the same tokens up to the first
// difference; there each side's token is among the other's top kTopK (a near
// tie, not a wrong model), and the comparison stops (the contexts differ).
// Returns the number of equal leading tokens.
int ExpectCloseGreedy(const std::vector<std::vector<int32_t>>& got,
                      const std::vector<std::vector<int32_t>>& want,
                      const std::string& what) {
  for (size_t t = 0; t < got.size() && t < want.size(); ++t) {
    if (got[t][0] == want[t][0]) continue;
    const auto in = [](int32_t tok, const std::vector<int32_t>& top) {
      return std::find(top.begin(), top.end(), tok) != top.end();
    };
    EXPECT_TRUE(in(got[t][0], want[t]) && in(want[t][0], got[t]))
        << what << ": token " << t << " differs and is not a near tie: got "
        << got[t][0] << ", want " << want[t][0];
    return static_cast<int>(t);
  }
  return static_cast<int>(std::min(got.size(), want.size()));
}

bool HaveGpu() { return CudaDeviceCount() > 0; }

// fp8 e4m3 KV against float64 (bf16 weights and activations as above):
// measured under the emulator, median 0.14, p90 0.23, max 0.46 over these
// checks (bf16: 0.02 and 0.08): 3 mantissa bits on every K and V of small
// random models. A misread block or a missing barrier gives ~1.
constexpr double kFp8Tolerance = 0.6;

// int8 (q8_0) KV against float64: measured under the emulator, median 0.03
// and max 0.14 over these checks (FMA and tensor-core decode alike): about
// 8 bits per value, read back through bf16, between bf16 and fp8.
constexpr double kInt8Tolerance = 0.2;

// The CUDA forward alone against the double-precision dense reference on
// random models (no file needed): MHA, GQA 4, MQA, qkv bias, both RoPE
// styles, a sliding window; chunked prefill, prefill mixed with decode, and
// decode, in shuffled blocks.
// `elem`: the KV element type; `tolerance`: the largest relative error of
// a logits row against float64.
void CheckRandomModels(const models::cuda::AttnTuning& tuning = {},
                       models::cuda::KvElem elem = models::cuda::KvElem::kBf16,
                       double tolerance = 0.12) {
  namespace mc = models::cuda;
  struct Case {
    int h, hkv;
    bool bias;
    models::RopeStyle style;
    int window;
  };
  const Case cases[] = {{4, 4, false, models::RopeStyle::kInterleaved, 0},
                        {8, 2, true, models::RopeStyle::kHalfSplit, 0},
                        {8, 1, false, models::RopeStyle::kHalfSplit, 0},
                        {4, 2, false, models::RopeStyle::kInterleaved, 6}};
  uint32_t seed = 1;
  std::vector<double> errors;  // relative error of every logits row checked
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.h << "/" << c.hkv << " bias "
                                      << c.bias << " window " << c.window);
    models::ModelConfig cfg =
        models::testing::SmallConfig(c.h, c.hkv, c.bias, c.style);
    cfg.head_dim = 64;
    cfg.hidden_size = 128;
    cfg.sliding_window = c.window;
    const auto w = models::testing::RandomWeights(cfg, seed++);
    auto m = mc::CudaLlamaModel::Create(cfg, *w, tuning);
    ASSERT_TRUE(m.ok()) << m.status();
    const int bs = 16, nb = 12;
    const int64_t plane = nb * (*m)->BlockBytes(bs, elem);
    mc::DeviceBuffer kv;
    ASSERT_TRUE(kv.Allocate(2LL * cfg.num_layers * plane, "kv").ok());
    const mc::CudaKvCache cache{nb, bs, kv.as<void>(), plane, elem};
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> seqs(2);
    for (auto& s : seqs) {
      for (int i = 0; i < 40; ++i) s.push_back(rng() % cfg.vocab_size);
    }
    const std::vector<std::vector<int32_t>> tables = {{7, 2, 9}, {11, 0, 4}};
    models::testing::DenseReference ref(cfg, *w);
    const auto want0 = ref.Logits(seqs[0]);
    const auto want1 = ref.Logits(seqs[1]);
    // (new tokens of seq 0, of seq 1) per step; 0 = not in the step.
    const std::vector<std::pair<int, int>> steps = {
        {10, 0}, {13, 5}, {1, 1}, {1, 30}, {1, 1}};
    std::vector<int> done(2, 0);
    for (auto [n0, n1] : steps) {
      models::ForwardBatch b;
      b.max_blocks_per_seq = 3;
      b.seq_starts = {0};
      std::vector<int> in_step;
      for (int s = 0; s < 2; ++s) {
        const int n = s == 0 ? n0 : n1;
        if (n == 0) continue;
        for (int j = 0; j < n; ++j) {
          const int pos = done[s] + j;
          b.token_ids.push_back(seqs[s][pos]);
          b.positions.push_back(pos);
          b.slot_mapping.push_back(tables[s][pos / bs] * bs + pos % bs);
        }
        done[s] += n;
        b.seq_starts.push_back(b.token_ids.size());
        b.context_lens.push_back(done[s]);
        b.block_tables.insert(b.block_tables.end(), tables[s].begin(),
                              tables[s].end());
        b.logits_rows.push_back(b.token_ids.size() - 1);
        in_step.push_back(s);
      }
      models::ForwardOutput out;
      const absl::Status st = (*m)->Forward(b, cache, &out);
      ASSERT_TRUE(st.ok()) << st;
      const absl::Span<const float> logits = out.logits;
      ASSERT_EQ(out.argmax.size(), in_step.size());
      for (size_t r = 0; r < in_step.size(); ++r) {
        // The device argmax is the host's over the same row.
        EXPECT_EQ(out.argmax[r],
                  Argmax(logits.data() + r * cfg.vocab_size, cfg.vocab_size));
        const int s = in_step[r];
        const std::vector<double>& want = (s == 0 ? want0 : want1)[done[s] - 1];
        double num = 0, den = 0;
        for (int v = 0; v < cfg.vocab_size; ++v) {
          const double g = logits[r * cfg.vocab_size + v];
          ASSERT_TRUE(std::isfinite(g));
          num += (g - want[v]) * (g - want[v]);
          den += want[v] * want[v];
        }
        // bf16 weights, activations and KV against float64: measured under
        // the emulator, median 0.02 and max 0.082 over these 40 checks;
        // a missing barrier or a misread block gives ~1.
        EXPECT_LT(std::sqrt(num / den), tolerance)
            << "sequence " << s << " position " << done[s] - 1;
        errors.push_back(std::sqrt(num / den));
      }
    }
  }
  std::sort(errors.begin(), errors.end());
  if (!errors.empty()) {
    std::printf(
        "KV %d: relative error of %zu logits rows: median %.3f, max "
        "%.3f\n",
        static_cast<int>(elem), errors.size(), errors[errors.size() / 2],
        errors.back());
  }
}

TEST(CudaForward, RandomModelsMatchDenseReference) {
  KV_SKIP_WITHOUT_GPU(HaveGpu());
  CheckRandomModels();
}

// The same with decode on the tensor-core kernel (AttnTuning::mma_decode).
TEST(CudaForward, RandomModelsMatchDenseReferenceMmaDecode) {
  KV_SKIP_WITHOUT_GPU(HaveGpu());
  CheckRandomModels({.mma_decode = true});
}

// fp8 e4m3 KV pages (bf16 weights): K and V rounded to 3 mantissa bits.
TEST(CudaForward, RandomModelsMatchDenseReferenceFp8Kv) {
  KV_SKIP_WITHOUT_GPU(HaveGpu());
  CheckRandomModels({}, models::cuda::KvElem::kFp8E4M3, kFp8Tolerance);
  CheckRandomModels({.mma_decode = true}, models::cuda::KvElem::kFp8E4M3,
                    kFp8Tolerance);
}

// int8 KV pages (q8_0: a fp16 scale per 32 values, read as bf16).
TEST(CudaForward, RandomModelsMatchDenseReferenceInt8Kv) {
  KV_SKIP_WITHOUT_GPU(HaveGpu());
  CheckRandomModels({}, models::cuda::KvElem::kInt8, kInt8Tolerance);
  CheckRandomModels({.mma_decode = true}, models::cuda::KvElem::kInt8,
                    kInt8Tolerance);
}

// Greedy decoding of the default model on the CUDA backend with KV pages of
// `dtype` against the CPU path; at least `min_equal` tokens (of kNewTokens
// per prompt) before the first near-tie difference.
void CheckGreedyOnDefaultModel(std::optional<kvcache::KvDtype> dtype,
                               std::string_view dtype_name, int min_equal);

TEST(CudaForward, GreedyMatchesCpuOnDefaultModel) {
  // Near ties are rare: 98 of the 128 tokens before the first difference
  // under the emulator (5 prompts identical throughout). A model that is
  // wrong but plausible diverges early everywhere.
  CheckGreedyOnDefaultModel(
      std::nullopt, "bf16",
      kNewTokens * static_cast<int>(Prompts().size()) / 2);
}

// fp8 e4m3 pages: 80 of the 128 tokens before the first (near-tie)
// difference under the emulator (bf16: 98), 2 prompts identical throughout.
TEST(CudaForward, GreedyMatchesCpuOnDefaultModelFp8Kv) {
  CheckGreedyOnDefaultModel(
      kvcache::KvDtype::kFP8, "fp8",
      kNewTokens * static_cast<int>(Prompts().size()) * 3 / 8);
}

// int8 (q8_0) pages, stored Hadamard-rotated: 98 of the 128 tokens before
// the first (near-tie) difference under the emulator (97 unrotated; bf16:
// 98), 5 prompts identical throughout; held to bf16's bound.
TEST(CudaForward, GreedyMatchesCpuOnDefaultModelInt8Kv) {
  CheckGreedyOnDefaultModel(
      kvcache::KvDtype::kInt8, "int8",
      kNewTokens * static_cast<int>(Prompts().size()) / 2);
}

void CheckGreedyOnDefaultModel(std::optional<kvcache::KvDtype> dtype,
                               std::string_view dtype_name, int min_equal) {
  KV_SKIP_WITHOUT_GPU(HaveGpu());
  if (!std::filesystem::exists(kModel)) {
    GTEST_SKIP() << kModel << " absent (deploy/setup.sh fetches it)";
  }
  auto cpu = LoadModel(kModel, Device::kCpu);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = LoadModel(kModel, Device::kCuda);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_EQ(gpu->model, nullptr);
  ASSERT_NE(gpu->weights, nullptr);
  const int vocab = cpu->config.vocab_size;

  std::vector<std::vector<int32_t>> prompts;
  int longest = 0;
  for (const std::string& p : Prompts()) {
    prompts.push_back(cpu->tokenizer->Encode(p, true, false));
    longest = std::max<int>(longest, prompts.back().size());
  }
  const int span = (longest + kNewTokens + kBlock - 1) / kBlock;
  const int blocks = span * static_cast<int>(prompts.size());

  KvStorageConfig kc{cpu->config.num_layers,
                     cpu->config.num_kv_heads,
                     cpu->config.head_dim,
                     kBlock,
                     blocks,
                     0};
  auto storage = KvCacheStorage::Create(kc);
  ASSERT_TRUE(storage.ok()) << storage.status();
  const auto want = Greedy(
      prompts, vocab, span, [&](const models::ForwardBatch& b, auto* logits) {
        absl::Status st = cpu->model->Forward(b, (*storage)->view(), logits);
        EXPECT_TRUE(st.ok()) << st;
        return st.ok();
      });
  ASSERT_EQ(want.size(), prompts.size());

  BackendConfig bc;
  bc.device = Device::kCuda;
  bc.block_size = kBlock;
  bc.kv_cache_bytes = 0;
  bc.gpu_memory_fraction = 0.5;
  bc.max_num_batched_tokens = 256;
  bc.swap_space_bytes = 64 << 20;
  bc.kv_dtype = dtype;
  auto backend = CreateBackend(bc, &*gpu);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ModelBackend& be = **backend;
  EXPECT_EQ(kvcache::KvDtypeName(be.kv_dtype()), dtype_name);
  ASSERT_GE(be.num_blocks(), blocks);
  EXPECT_GT(be.num_swap_slots(), 0);
  EXPECT_GT(be.seconds_per_prefill_token(), 0.0);
  int step = 0;
  const auto got = Greedy(
      prompts, vocab, span, [&](const models::ForwardBatch& b, auto* logits) {
        // First decode step: with every other row argmax_only first (the
        // same K/V is written again by the full run after it).
        std::vector<int32_t> reduced;
        if (step++ == 1) {
          models::ForwardBatch half = b;
          for (size_t r = 0; r < b.logits_rows.size(); ++r) {
            half.argmax_only.push_back(r % 2 == 0);
          }
          models::ForwardOutput out;
          const absl::Status st = be.Forward(half, &out);
          EXPECT_TRUE(st.ok()) << st;
          reduced = out.argmax;
          logits->assign(out.logits.begin(), out.logits.end());
        }
        models::ForwardOutput out;
        const absl::Status st = be.Forward(b, &out);
        EXPECT_TRUE(st.ok()) << st;
        if (!st.ok()) return false;
        EXPECT_EQ(out.argmax.size(), b.logits_rows.size());
        for (size_t r = 0; r < out.argmax.size(); ++r) {
          EXPECT_EQ(out.argmax[r], Argmax(out.logits.data() + r * vocab, vocab))
              << "row " << r;
          if (reduced.empty()) continue;
          // argmax_only changes what is copied, never the result.
          EXPECT_EQ(reduced[r], out.argmax[r]) << "row " << r;
          if (r % 2 == 1) {
            EXPECT_TRUE(std::equal(out.logits.begin() + r * vocab,
                                   out.logits.begin() + (r + 1) * vocab,
                                   logits->begin() + r * vocab))
                << "row " << r << " (not argmax_only) was not copied whole";
          }
        }
        logits->assign(out.logits.begin(), out.logits.end());
        return true;
      });
  ASSERT_EQ(got.size(), prompts.size());
  int equal = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int same = ExpectCloseGreedy(
        got[i], want[i], "prompt " + std::to_string(i) + " " + Prompts()[i]);
    std::printf("prompt %zu: %d of %d greedy tokens equal to the CPU path's\n",
                i, same, kNewTokens);
    equal += same;
  }
  EXPECT_GE(equal, min_equal);

  // Moving sequence 0's blocks elsewhere (copy, then swap out and back in)
  // keeps its KV: regenerating from the moved blocks gives the same tokens.
  std::vector<BlockMove> copies, outs, ins;
  for (int j = 0; j < span; ++j) {
    copies.push_back({j, blocks + j});  // past every sequence's blocks
    outs.push_back({blocks + j, j});
    ins.push_back({j, 2 * blocks + j});
  }
  if (be.num_blocks() >= 3 * blocks && be.num_swap_slots() >= span) {
    ASSERT_TRUE(be.CopyBlocks(copies).ok());
    ASSERT_TRUE(be.SwapOut(outs).ok());
    ASSERT_TRUE(be.SwapIn(ins).ok());
    // Decode one more token for sequence 0 from blocks 2 * blocks + j.
    const std::vector<int32_t> got0 = Tokens(got[0]);
    std::vector<int32_t> seq = prompts[0];
    seq.insert(seq.end(), got0.begin(), got0.end() - 1);
    models::ForwardBatch b;
    const int32_t pos = static_cast<int32_t>(seq.size());
    b.token_ids = {got0.back()};
    b.positions = {pos};
    b.slot_mapping = {(2 * blocks + pos / kBlock) * kBlock + pos % kBlock};
    b.seq_starts = {0, 1};
    b.context_lens = {pos + 1};
    b.max_blocks_per_seq = span;
    for (int j = 0; j < span; ++j) b.block_tables.push_back(2 * blocks + j);
    b.logits_rows = {0};
    models::ForwardOutput moved;
    ASSERT_TRUE(be.Forward(b, &moved).ok());
    // The same step from the original blocks.
    models::ForwardBatch a = b;
    a.slot_mapping = {pos};
    for (int j = 0; j < span; ++j) a.block_tables[j] = j;
    models::ForwardOutput original;
    ASSERT_TRUE(be.Forward(a, &original).ok());
    EXPECT_EQ(Argmax(moved.logits.data(), vocab),
              Argmax(original.logits.data(), vocab));
  }
}

}  // namespace
}  // namespace kvserve::engine

#else  // !KVSERVE_CUDA

TEST(CudaForward, NotBuilt) {
  GTEST_SKIP() << "built without CUDA (KVSERVE_CUDA=OFF)";
}

#endif  // KVSERVE_CUDA
