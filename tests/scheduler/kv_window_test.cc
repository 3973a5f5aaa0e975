// Bounded KV (Request::set_kv_window, kv_policy "streaming") in the
// scheduler: a fake engine keeps the KV contents in an array keyed by slot,
// performs each step's block moves, writes each new token at its KV index
// (position - kv_offset), and checks at every produced token that the
// request's table holds exactly the sinks' blocks, then every token from the
// first kept one on, and at least the last `window` tokens: a wrong offset,
// a dropped block still in the table or a kept one missing shows up as a
// mismatch. Also: the table stays flat past max_model_len, preemption (swap
// and recompute) and forks keep the window, and nothing computed after a
// drop enters the prefix cache.
#include <algorithm>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {
namespace {

using kvcache::BlockMove;
using ::testing::HasSubstr;

constexpr int32_t kBlock = 4;

std::vector<int32_t> Iota(int32_t begin, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = begin + i;
  return v;
}

SchedulerConfig WindowConfig() {
  SchedulerConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.block_size = kBlock;
  c.num_blocks = 40;
  c.watermark = 0.0;
  c.max_model_len = 32;
  c.enable_prefix_caching = false;
  return c;
}

class FakeEngine {
 public:
  explicit FakeEngine(const SchedulerConfig& c)
      : sched_(c),
        kv_(static_cast<size_t>(c.num_blocks) * kBlock, -1),
        swap_(static_cast<size_t>(c.num_swap_slots) * kBlock, -1) {}

  Scheduler& sched() { return sched_; }

  absl::Status Add(RequestId id, std::vector<int32_t> prompt,
                   int32_t max_tokens, KvWindow window) {
    auto r = std::make_unique<Request>(id, std::move(prompt), max_tokens);
    r->set_kv_window(window);
    return sched_.AddRequest(std::move(r));
  }

  SchedulerOutput Step() {
    Check();
    SchedulerOutput out = sched_.Schedule();
    Check();
    for (const BlockMove& m : out.blocks_to_swap_out)
      Move(kv_, m.src, swap_, m.dst);
    for (const BlockMove& m : out.blocks_to_swap_in)
      Move(swap_, m.src, kv_, m.dst);
    for (const BlockMove& m : out.blocks_to_copy) Move(kv_, m.src, kv_, m.dst);
    std::vector<int32_t> sampled;
    for (const ScheduledRequest& s : out.scheduled) {
      const Request* r = sched_.GetRequest(s.id);
      const auto table = out.BlockTable(s);
      const auto ids = out.TokenIds(s);
      for (int32_t k = 0; k < s.num_new_tokens; ++k) {
        const int32_t kv = s.start_position + k - s.kv_offset;
        kv_.at(table[kv / kBlock] * kBlock + kv % kBlock) = ids[k];
      }
      const int32_t held = s.start_position + s.num_new_tokens - s.kv_offset;
      max_held_ = std::max(max_held_, held);
      EXPECT_LE(held, sched_.config().max_model_len);
      if (s.produces_token) ExpectWindow(*r, s, table);
      if (s.produces_token) sampled.push_back(1000 + r->num_output_tokens());
    }
    finished_ = sched_.UpdateFromOutput(out, sampled);
    Check();
    return out;
  }

  void Run(int max_steps = 2000) {
    for (int i = 0; i < max_steps && sched_.has_work(); ++i) Step();
    EXPECT_FALSE(sched_.has_work());
  }

  int32_t max_held() const { return max_held_; }
  int32_t windows_checked() const { return windows_checked_; }

 private:
  // The table holds the sinks' blocks, then tokens kv_offset + k on.
  void ExpectWindow(const Request& r, const ScheduledRequest& s,
                    absl::Span<const kvcache::BlockId> table) {
    const KvWindow& w = r.kv_window();
    const int32_t sink_tokens = (w.sinks + kBlock - 1) / kBlock * kBlock;
    const int32_t held = s.start_position + s.num_new_tokens - s.kv_offset;
    for (int32_t kv = 0; kv < held; ++kv) {
      const int32_t pos = kv < sink_tokens ? kv : kv + s.kv_offset;
      ASSERT_EQ(kv_.at(table[kv / kBlock] * kBlock + kv % kBlock), r.token(pos))
          << "request " << s.id << " KV index " << kv;
    }
    // Everything in the window is there.
    const int32_t total = s.start_position + s.num_new_tokens;
    EXPECT_LE(s.kv_offset + sink_tokens,
              std::max(sink_tokens, total - w.window))
        << "request " << s.id << " dropped a token inside its window";
    ++windows_checked_;
  }
  void Move(const std::vector<int32_t>& from, int32_t src,
            std::vector<int32_t>& to, int32_t dst) {
    std::copy_n(from.begin() + static_cast<ptrdiff_t>(src) * kBlock, kBlock,
                to.begin() + static_cast<ptrdiff_t>(dst) * kBlock);
  }
  void Check() {
    const absl::Status s = sched_.CheckInvariants();
    ASSERT_TRUE(s.ok()) << s;
  }

  Scheduler sched_;
  std::vector<int32_t> kv_, swap_;
  std::vector<FinishedRequest> finished_;
  int32_t max_held_ = 0;
  int32_t windows_checked_ = 0;
};

TEST(KvWindowTest, RunsFlatFarPastMaxModelLen) {
  FakeEngine e(WindowConfig());
  // max_model_len 32; 10 prompt + 90 outputs = 100 tokens.
  ASSERT_TRUE(e.Add(1, Iota(1, 10), 90, {.sinks = 2, .window = 12}).ok());
  e.Run();
  // Sinks' block (4) + window (12) + the block being written (< 4) + 1.
  EXPECT_LE(e.max_held(), 4 + 12 + kBlock);
  EXPECT_EQ(e.windows_checked(), 90);
  const SchedulerStats st = e.sched().stats();
  EXPECT_GT(st.num_dropped_blocks_total, 18);
  EXPECT_EQ(st.kv.active_blocks, 0);
}

TEST(KvWindowTest, LongPromptIsPrefilledInChunksThatDrop) {
  SchedulerConfig c = WindowConfig();
  c.max_num_batched_tokens = 8;
  FakeEngine e(c);
  // A prompt longer than max_model_len, under a window.
  ASSERT_TRUE(e.Add(1, Iota(1, 70), 5, {.sinks = 4, .window = 16}).ok());
  e.Run();
  EXPECT_LE(e.max_held(), c.max_model_len);
  EXPECT_EQ(e.windows_checked(), 5);
}

TEST(KvWindowTest, WithoutAWindowThePromptMustFitTheContext) {
  FakeEngine e(WindowConfig());
  const absl::Status s = e.Add(1, Iota(1, 70), 5, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvWindowTest, RefusesAWindowThatCannotBeHonoured) {
  FakeEngine e(WindowConfig());
  // 4 sink tokens + 25 + one block of 4 pass max_model_len 32.
  absl::Status s = e.Add(1, Iota(1, 8), 5, {.sinks = 4, .window = 25});
  EXPECT_THAT(s.message(), HasSubstr("kv_policy.window"));
  s = e.Add(2, Iota(1, 8), 5, {.sinks = -1, .window = 8});
  EXPECT_THAT(s.message(), HasSubstr("kv_policy.sinks"));
  SchedulerConfig slab = WindowConfig();
  slab.kv_reservation = KvReservation::kMaxLength;
  FakeEngine e2(slab);
  s = e2.Add(3, Iota(1, 8), 5, {.sinks = 4, .window = 8});
  EXPECT_THAT(s.message(), HasSubstr("kv_policy.type"));
}

TEST(KvWindowTest, SwapAndRecomputeKeepTheWindow) {
  for (PreemptionMode mode :
       {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
    SchedulerConfig c = WindowConfig();
    c.num_blocks = 12;  // two windows of 6 blocks do not fit with growth
    c.num_swap_slots = 16;
    c.preemption_mode = mode;
    FakeEngine e(c);
    for (RequestId id = 1; id <= 3; ++id) {
      ASSERT_TRUE(
          e.Add(id, Iota(id * 100, 6), 60, {.sinks = 4, .window = 12}).ok());
    }
    e.Run();
    const SchedulerStats st = e.sched().stats();
    EXPECT_GT(
        st.num_preemptions_swap_total + st.num_preemptions_recompute_total, 0)
        << "mode " << PreemptionModeName(mode);
    EXPECT_EQ(e.windows_checked(), 180);
  }
}

TEST(KvWindowTest, ForkChildKeepsTheParentsWindow) {
  SchedulerConfig c = WindowConfig();
  c.max_num_batched_tokens = 8;
  FakeEngine e(c);
  ASSERT_TRUE(e.Add(1, Iota(1, 40), 30, {.sinks = 4, .window = 12}).ok());
  SchedulerOutput out;
  do {
    out = e.Step();
  } while (e.sched().GetRequest(1)->num_output_tokens() == 0);
  const Request* p = e.sched().GetRequest(1);
  ASSERT_GT(p->kv_dropped_tokens(), 0);  // the prompt passed the window
  auto child = std::make_unique<Request>(2, p->prompt_token_ids(), 30);
  child->set_kv_window(p->kv_window());
  child->set_output_token_ids({5555});
  ASSERT_TRUE(e.sched().Fork(1, std::move(child)).ok());
  EXPECT_EQ(e.sched().GetRequest(2)->kv_dropped_tokens(),
            p->kv_dropped_tokens());
  e.Run();
  EXPECT_EQ(e.windows_checked(), 30 + 29);
}

TEST(KvWindowTest, ForkBeforeAnyDropThenBothDrop) {
  SchedulerConfig c = WindowConfig();
  c.num_blocks = 12;  // freed blocks are reused soon
  FakeEngine e(c);
  ASSERT_TRUE(e.Add(1, Iota(1, 10), 40, {.sinks = 4, .window = 8}).ok());
  e.Step();
  const Request* p = e.sched().GetRequest(1);
  ASSERT_EQ(p->kv_dropped_tokens(), 0);
  auto child = std::make_unique<Request>(2, p->prompt_token_ids(), 40);
  child->set_kv_window(p->kv_window());
  child->set_output_token_ids({5555});
  ASSERT_TRUE(e.sched().Fork(1, std::move(child)).ok());
  e.Run();
  EXPECT_EQ(e.windows_checked(), 1 + 39 + 39);
}

TEST(KvWindowTest, NothingComputedAfterADropIsCached) {
  SchedulerConfig c = WindowConfig();
  c.enable_prefix_caching = true;
  FakeEngine e(c);
  e.sched().kv_cache_for_tiers().set_record_events(true);
  ASSERT_TRUE(e.Add(1, Iota(1, 8), 40, {.sinks = 4, .window = 8}).ok());
  e.Run();
  int32_t stored = 0;
  for (const kvcache::KvEvent& ev :
       e.sched().kv_cache_for_tiers().TakeEvents()) {
    if (ev.kind == kvcache::KvEvent::Kind::kStored) ++stored;
  }
  // Blocks 0-3 (tokens 0-15) fill before the first drop (at 20 computed
  // tokens: 4 sink + 8 window + 8); none after it.
  EXPECT_GE(stored, 2);
  EXPECT_LE(stored, 4);
}

TEST(HeavyHitterDropsTest, LowestMassPastTheSinksAndBeforeTheWindow) {
  const KvWindow w{.sinks = 4, .window = 8, .budget = 20};
  // 7 blocks of 4 = 28 tokens: sink block 0; blocks 5-6 hold the last 8.
  const std::vector<float> mass = {5, 1, 9, 0.5f, 3, 0, 0};
  EXPECT_EQ(HeavyHitterDrops(w, 28, mass, kBlock),
            (std::vector<int32_t>{3, 1}));  // 8 over: two blocks
  EXPECT_EQ(HeavyHitterDrops(w, 25, mass, kBlock),
            (std::vector<int32_t>{3, 1}));  // 5 over: two blocks
  EXPECT_TRUE(HeavyHitterDrops(w, 20, mass, kBlock).empty());
  // Ties go to the oldest.
  const std::vector<float> flat(7, 1.0f);
  EXPECT_EQ(HeavyHitterDrops(w, 24, flat, kBlock), (std::vector<int32_t>{1}));
}

// The scheduler under heavy_hitters, fed a mass per block that marks the
// blocks holding positions 12 and 36 as attended: it drops only the others,
// keeps the sinks' block and the window, and holds at most the budget plus
// the step's token.
TEST(KvWindowTest, HeavyHittersKeepTheAttendedBlocks) {
  const SchedulerConfig c = WindowConfig();
  Scheduler sched(c);
  const KvWindow w{.sinks = 4, .window = 8, .budget = 24};
  auto r = std::make_unique<Request>(1, Iota(1, 10), 60);
  r->set_kv_window(w);
  ASSERT_TRUE(sched.AddRequest(std::move(r)).ok());
  std::vector<int32_t> pos_at(static_cast<size_t>(c.num_blocks) * kBlock, -1);
  int32_t total = 0;
  while (sched.has_work()) {
    SchedulerOutput out = sched.Schedule();
    ASSERT_EQ(out.scheduled.size(), 1u);
    const ScheduledRequest& s = out.scheduled[0];
    EXPECT_TRUE(s.track_mass);
    EXPECT_EQ(s.kv_sink_len, 0);  // positions as written
    const auto table = out.BlockTable(s);
    for (int32_t k = 0; k < s.num_new_tokens; ++k) {
      const int32_t kv = s.start_position + k - s.kv_offset;
      pos_at[table[kv / kBlock] * kBlock + kv % kBlock] = s.start_position + k;
    }
    total = s.start_position + s.num_new_tokens;
    const int32_t held = total - s.kv_offset;
    EXPECT_LE(held, w.budget + kBlock);
    std::vector<int32_t> kept;
    std::vector<float> mass(s.num_blocks, 1.0f);
    for (int32_t kv = 0; kv < held; ++kv) {
      const int32_t p = pos_at[table[kv / kBlock] * kBlock + kv % kBlock];
      kept.push_back(p);
      if (p == 12 || p == 36) mass[kv / kBlock] = 100.0f;
    }
    // The sinks' block, then increasing positions ending at the last one.
    for (int32_t p = 0; p < 4; ++p) EXPECT_EQ(kept[p], p);
    EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
    EXPECT_EQ(kept.back(), total - 1);
    for (int32_t p = std::max(0, total - w.window); p < total; ++p) {
      EXPECT_TRUE(std::binary_search(kept.begin(), kept.end(), p)) << p;
    }
    for (const int32_t p : {12, 36}) {
      EXPECT_TRUE(p >= total || std::binary_search(kept.begin(), kept.end(), p))
          << "attended position " << p << " dropped at " << total;
    }
    sched.AddBlockMass(out, mass, s.num_blocks);
    sched.UpdateFromOutput(out, std::vector<int32_t>(out.num_producing(), 7));
    ASSERT_TRUE(sched.CheckInvariants().ok());
  }
  EXPECT_EQ(total, 69);  // the last output is sampled, not computed
  EXPECT_GT(sched.stats().num_dropped_blocks_total, 5);
}

TEST(KvWindowTest, RefusesABudgetThatCannotBeHonoured) {
  FakeEngine e(WindowConfig());
  // Below sinks' block + window + one block; above max_model_len's room.
  absl::Status s =
      e.Add(1, Iota(1, 8), 5, {.sinks = 4, .window = 8, .budget = 15});
  EXPECT_THAT(s.message(), HasSubstr("kv_policy.budget"));
  s = e.Add(2, Iota(1, 8), 5, {.sinks = 4, .window = 8, .budget = 33});
  EXPECT_THAT(s.message(), HasSubstr("kv_policy.budget"));
  EXPECT_TRUE(
      e.Add(3, Iota(1, 8), 5, {.sinks = 4, .window = 8, .budget = 16}).ok());
}

}  // namespace
}  // namespace kvserve::scheduler
