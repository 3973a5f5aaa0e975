// The scheduler's forks (copy-on-write), preemption by swap (cost model,
// forced modes, fallback), thrash guard, high watermark and cache-aware
// order. A fake engine keeps the KV contents in an array keyed by block id
// and one keyed by swap slot, performs each step's swap-outs, swap-ins and
// copies in the documented order before writing the step's tokens, and
// checks that every producing request reads all of its tokens back: a wrong
// move, a wrong order or a missed copy shows up as a mismatch.
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {
namespace {

using kvcache::BlockMove;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

int32_t SampledToken(RequestId id, int32_t k) {
  return static_cast<int32_t>(100000 + id * 1000 + k);
}

std::vector<int32_t> Iota(int32_t begin, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = begin + i;
  return v;
}

SchedulerConfig BaseConfig() {
  SchedulerConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 100;
  c.block_size = 4;
  c.num_blocks = 16;
  c.watermark = 0.0;
  c.max_model_len = 64;
  c.enable_prefix_caching = false;
  return c;
}

class FakeEngine {
 public:
  explicit FakeEngine(const SchedulerConfig& c)
      : sched_(c),
        b_(c.block_size),
        kv_(static_cast<size_t>(c.num_blocks) * c.block_size, -1),
        swap_(static_cast<size_t>(c.num_swap_slots) * c.block_size, -1) {}

  Scheduler& sched() { return sched_; }

  void Add(RequestId id, std::vector<int32_t> prompt, int32_t max_tokens,
           int32_t priority = 0) {
    const absl::Status s = sched_.AddRequest(
        std::make_unique<Request>(id, std::move(prompt), max_tokens, priority));
    ASSERT_TRUE(s.ok()) << s;
  }

  // A child of `parent` with the same prompt and its own first token.
  absl::Status Fork(RequestId parent, RequestId child, int32_t max_tokens) {
    const Request* p = sched_.GetRequest(parent);
    auto r =
        std::make_unique<Request>(child, p->prompt_token_ids(), max_tokens);
    r->set_output_token_ids({SampledToken(child, 0)});
    return sched_.Fork(parent, std::move(r));
  }

  SchedulerOutput Step() {
    Check();
    const SchedulerStats before = sched_.stats();
    SchedulerOutput out = sched_.Schedule();
    const SchedulerStats after = sched_.stats();
    // The step's increments are the difference of the cumulative counters.
    EXPECT_EQ(
        out.stats.preemptions_swap,
        after.num_preemptions_swap_total - before.num_preemptions_swap_total);
    EXPECT_EQ(out.stats.preemptions_recompute,
              after.num_preemptions_recompute_total -
                  before.num_preemptions_recompute_total);
    EXPECT_EQ(
        out.stats.recomputed_tokens,
        after.num_recomputed_tokens_total - before.num_recomputed_tokens_total);
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
        const int32_t p = s.start_position + k;
        EXPECT_EQ(ids[k], r->token(p));
        kv_.at(table[p / b_] * b_ + p % b_) = ids[k];
      }
      if (!s.produces_token) continue;
      for (int32_t p = 0; p < r->num_tokens(); ++p) {
        EXPECT_EQ(kv_.at(table[p / b_] * b_ + p % b_), r->token(p))
            << "request " << s.id << " position " << p << " step " << out.step;
      }
      sampled.push_back(SampledToken(s.id, r->num_output_tokens()));
    }
    finished_ = sched_.UpdateFromOutput(out, sampled);
    Check();
    return out;
  }

  void Run(int max_steps = 1000) {
    for (int i = 0; i < max_steps && sched_.has_work(); ++i) Step();
    EXPECT_FALSE(sched_.has_work());
  }

  const std::vector<FinishedRequest>& finished() const { return finished_; }

 private:
  void Move(const std::vector<int32_t>& from, int32_t src,
            std::vector<int32_t>& to, int32_t dst) {
    std::copy_n(from.begin() + static_cast<ptrdiff_t>(src) * b_, b_,
                to.begin() + static_cast<ptrdiff_t>(dst) * b_);
  }
  void Check() {
    const absl::Status s = sched_.CheckInvariants();
    ASSERT_TRUE(s.ok()) << s;
  }

  Scheduler sched_;
  int32_t b_;
  std::vector<int32_t> kv_, swap_;
  std::vector<FinishedRequest> finished_;
};

std::vector<kvcache::BlockId> Table(const Scheduler& s, RequestId id) {
  return s.kv_cache().GetBlockTable(id);
}

TEST(ForkTest, ChildSharesBlocksAndPartialBlockIsCopiedOnWrite) {
  FakeEngine e(BaseConfig());
  e.Add(1, Iota(0, 6), 5);
  e.Step();  // prefill 6 tokens into blocks [0 1]; samples token 0
  ASSERT_TRUE(e.Fork(1, 2, 5).ok());
  const Scheduler& s = e.sched();
  EXPECT_THAT(Table(s, 2), ElementsAre(0, 1));
  EXPECT_EQ(s.kv_cache().pool().ref_count(0), 2);
  EXPECT_EQ(s.kv_cache().pool().ref_count(1), 2);
  EXPECT_EQ(s.GetRequest(2)->num_computed_tokens(), 6);
  EXPECT_EQ(s.num_running(), 2);
  // The parent writes position 6 first (admission order): it copies the
  // shared half-full block 1 to 2; the child then owns 1 and writes in place.
  const SchedulerOutput out = e.Step();
  EXPECT_THAT(out.blocks_to_copy, ElementsAre(BlockMove{1, 2}));
  EXPECT_THAT(Table(s, 1), ElementsAre(0, 2));
  EXPECT_THAT(Table(s, 2), ElementsAre(0, 1));
  EXPECT_EQ(s.kv_cache().pool().ref_count(0), 2);  // full: never copied
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[1].id, 2);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 1);  // no prefill for the child
  EXPECT_EQ(s.stats().num_copied_blocks_total, 1);
  e.Run();
  EXPECT_EQ(s.kv_usage().free_blocks, 16);
}

TEST(ForkTest, FourCompletionsShareThePromptAndUseLessKv) {
  FakeEngine e(BaseConfig());
  e.Add(1, Iota(0, 9), 4);  // 9 prompt + 4 output: 4 blocks alone
  e.Step();
  for (RequestId c = 2; c <= 4; ++c) ASSERT_TRUE(e.Fork(1, c, 4).ok());
  e.Step();
  // 2 full prompt blocks shared by 4, plus one private block each.
  EXPECT_EQ(e.sched().kv_usage().active_blocks, 2 + 4);
  e.Run();
  EXPECT_EQ(e.sched().kv_usage().free_blocks, 16);
}

TEST(ForkTest, RejectsBadForks) {
  FakeEngine e(BaseConfig());
  e.Add(1, Iota(0, 6), 5);
  e.Add(2, Iota(50, 6), 5);
  auto child = [](RequestId id, std::vector<int32_t> prompt,
                  std::vector<int32_t> out) {
    auto r = std::make_unique<Request>(id, std::move(prompt), 5);
    r->set_output_token_ids(std::move(out));
    return r;
  };
  // Not running yet.
  EXPECT_EQ(e.sched().Fork(1, child(3, Iota(0, 6), {1})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.sched().Fork(9, child(3, Iota(0, 6), {1})).code(),
            absl::StatusCode::kFailedPrecondition);
  const SchedulerOutput out = e.sched().Schedule();
  EXPECT_THAT(e.sched().Fork(1, child(3, Iota(0, 6), {1})).message(),
              HasSubstr("between Schedule and UpdateFromOutput"));
  (void)e.sched().UpdateFromOutput(out, {7, 7});
  absl::Status s = e.sched().Fork(1, child(3, Iota(1, 6), {1}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("token 0"));
  s = e.sched().Fork(1, child(3, Iota(0, 6), {}));  // nothing to compute
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = e.sched().Fork(1, child(2, Iota(0, 6), {1}));  // id taken
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(e.sched().Fork(1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(e.sched().CheckInvariants().ok());
}

// Two requests that together outgrow 6 blocks: the later one is preempted.
SchedulerConfig TightConfig(PreemptionMode mode, int32_t slots) {
  SchedulerConfig c = BaseConfig();
  c.num_blocks = 6;
  c.num_swap_slots = slots;
  c.preemption_mode = mode;
  c.thrash_preemption_limit = 0;
  return c;
}

void AddTwo(FakeEngine& e) {
  e.Add(1, Iota(0, 8), 8);
  e.Add(2, Iota(100, 8), 8);
}

TEST(SwapTest, SwappedRequestResumesWithoutRecompute) {
  FakeEngine e(TightConfig(PreemptionMode::kSwap, 8));
  AddTwo(e);
  SchedulerOutput out;
  do {
    out = e.Step();
  } while (out.preempted.empty() && e.sched().has_work());
  ASSERT_THAT(out.preempted, ElementsAre(2));
  const Request* r2 = e.sched().GetRequest(2);
  const int32_t computed = r2->num_computed_tokens();
  EXPECT_EQ(computed, 12);  // 8 prompt + 4 decoded, kept
  EXPECT_EQ(r2->status(), RequestStatus::kPreempted);
  // Its 3 blocks went to slots 0..2 (ids after request 1's growth).
  ASSERT_EQ(out.blocks_to_swap_out.size(), 3u);
  EXPECT_EQ(out.blocks_to_swap_out[0].dst, 0);
  EXPECT_EQ(out.blocks_to_swap_out[2].dst, 2);
  EXPECT_EQ(e.sched().stats().swap_slots_used, 3);
  EXPECT_EQ(e.sched().stats().num_preemptions_swap_total, 1);
  // Readmitted with its slots swapped in, it decodes on (one new token).
  do {
    out = e.Step();
  } while (out.blocks_to_swap_in.empty() && e.sched().has_work());
  ASSERT_EQ(out.blocks_to_swap_in.size(), 3u);
  EXPECT_EQ(out.blocks_to_swap_in[0].src, 0);
  const ScheduledRequest& s = out.scheduled.back();
  EXPECT_EQ(s.id, 2);
  EXPECT_EQ(s.start_position, computed);
  EXPECT_EQ(s.num_new_tokens, 1);
  e.Run();
  const SchedulerStats st = e.sched().stats();
  EXPECT_EQ(st.num_preemptions_recompute_total, 0);
  EXPECT_EQ(st.num_recomputed_tokens_total, 0);
  EXPECT_EQ(st.num_swapped_out_blocks_total, st.num_swapped_in_blocks_total);
  EXPECT_EQ(st.swap_slots_used, 0);
  EXPECT_EQ(st.swap_slots_total, 8);
}

// Preempts once under `c` and returns the stats.
SchedulerStats PreemptOnce(const SchedulerConfig& c) {
  FakeEngine e(c);
  AddTwo(e);
  e.Run();
  return e.sched().stats();
}

TEST(SwapTest, CostModelPicksTheCheaperMode) {
  SchedulerConfig c = TightConfig(PreemptionMode::kAuto, 8);
  c.recompute_seconds_per_token = 1e-3;  // 12 tokens: 12 ms
  c.swap_seconds_per_block = 1e-4;       // 2 x 3 blocks: 0.6 ms
  SchedulerStats s = PreemptOnce(c);
  EXPECT_EQ(s.num_preemptions_swap_total, 1);
  EXPECT_EQ(s.num_preemptions_recompute_total, 0);
  c.swap_seconds_per_block = 1e-2;  // 2 x 3 blocks: 60 ms
  s = PreemptOnce(c);
  EXPECT_EQ(s.num_preemptions_swap_total, 0);
  EXPECT_EQ(s.num_preemptions_recompute_total, 1);
  EXPECT_EQ(s.num_recomputed_tokens_total, 12);
  EXPECT_EQ(s.num_preempted_tokens_total, 12);
}

TEST(SwapTest, ForcedModesAndFallbackWhenSlotsLack) {
  SchedulerConfig c = TightConfig(PreemptionMode::kRecompute, 8);
  c.swap_seconds_per_block = 0;  // swap would be free: still recompute
  c.recompute_seconds_per_token = 1;
  EXPECT_EQ(PreemptOnce(c).num_preemptions_recompute_total, 1);
  c = TightConfig(PreemptionMode::kSwap, 8);
  c.swap_seconds_per_block = 1;  // swap would be dear: still swap
  EXPECT_EQ(PreemptOnce(c).num_preemptions_swap_total, 1);
  c = TightConfig(PreemptionMode::kSwap, 2);  // 3 blocks to save, 2 slots
  const SchedulerStats s = PreemptOnce(c);
  EXPECT_EQ(s.num_preemptions_swap_total, 0);
  EXPECT_EQ(s.num_preemptions_recompute_total, 1);
}

TEST(SwapTest, FinishedRequestsReportTheirPreemptions) {
  FakeEngine e(TightConfig(PreemptionMode::kSwap, 8));
  AddTwo(e);
  int32_t preemptions_of_2 = -1;
  for (int i = 0; i < 100 && e.sched().has_work(); ++i) {
    e.Step();
    for (const FinishedRequest& f : e.finished()) {
      if (f.id == 2) preemptions_of_2 = f.num_preemptions;
    }
  }
  EXPECT_EQ(preemptions_of_2, 1);
}

TEST(SwapTest, AbortOfSwappedRequestFreesItsSlots) {
  FakeEngine e(TightConfig(PreemptionMode::kSwap, 8));
  AddTwo(e);
  while (e.sched().stats().swap_slots_used == 0) e.Step();
  ASSERT_TRUE(e.sched().Abort(2).ok());
  EXPECT_EQ(e.sched().stats().swap_slots_used, 0);
  e.Run();
}

// Two growing requests on 7 blocks, 8-token steps: request 2 is preempted
// with 12 tokens computed. Without the guard it is readmitted with a
// 7-token chunk that cannot last; with it, it waits until all 13 tokens'
// blocks fit.
TEST(ThrashGuardTest, ReadmitsOnlyWhenTheWholeRemainingPrefillFits) {
  auto run = [](int32_t limit, int64_t* guard_stops) {
    SchedulerConfig c = BaseConfig();
    c.num_blocks = 7;
    c.max_num_batched_tokens = 8;
    c.preemption_mode = PreemptionMode::kRecompute;
    c.thrash_preemption_limit = limit;
    FakeEngine e(c);
    e.Add(1, Iota(0, 4), 20);
    e.Add(2, Iota(100, 4), 20);
    *guard_stops = 0;
    for (int i = 0; i < 200 && e.sched().has_work(); ++i) {
      const SchedulerOutput out = e.Step();
      if (e.sched().stats().last_admission_stop ==
          AdmissionStop::kThrashGuard) {
        ++*guard_stops;
      }
      for (const ScheduledRequest& s : out.scheduled) {
        const Request* r = e.sched().GetRequest(s.id);
        if (limit > 0 && r != nullptr && s.start_position == 0 &&
            r->num_preemptions() > 0) {
          // Readmitted: all its remaining blocks were free.
          EXPECT_EQ(s.num_new_tokens, 8);
        }
      }
    }
    EXPECT_FALSE(e.sched().has_work());
    return e.sched().stats().num_preemptions_total;
  };
  int64_t stops_off = 0, stops_on = 0;
  const int64_t off = run(0, &stops_off);
  const int64_t on = run(1, &stops_on);
  EXPECT_EQ(stops_off, 0);
  EXPECT_GT(stops_on, 0);
  EXPECT_LT(on, off);
}

TEST(HighWatermarkTest, StopsAdmissionAboveTheFraction) {
  for (const double hw : {0.5, 1.0}) {
    SchedulerConfig c = BaseConfig();
    c.num_blocks = 10;
    c.admission_high_watermark = hw;
    FakeEngine e(c);
    for (RequestId id = 1; id <= 4; ++id) e.Add(id, Iota(id * 100, 8), 2);
    e.Step();
    // 2 blocks each: 0, 2 and 4 active blocks are <= 5; 6 are not.
    EXPECT_EQ(e.sched().num_running(), hw == 0.5 ? 3 : 4) << hw;
    if (hw == 0.5) {
      EXPECT_EQ(e.sched().stats().last_admission_stop,
                AdmissionStop::kHighWatermark);
    }
    e.Run();
  }
}

TEST(CacheAwareTest, LongestCachedPrefixFirstAmongEqualPriority) {
  for (const SchedulingPolicy policy :
       {SchedulingPolicy::kFcfs, SchedulingPolicy::kCacheAware}) {
    SchedulerConfig c = BaseConfig();
    c.enable_prefix_caching = true;
    c.max_num_seqs = 1;
    c.policy = policy;
    FakeEngine e(c);
    e.Add(1, Iota(0, 12), 1);
    e.Run();  // its 3 full blocks stay cached
    e.Add(2, Iota(500, 12), 2);
    std::vector<int32_t> shared = Iota(0, 12);
    shared.push_back(9);
    e.Add(3, shared, 2);
    e.Add(4, Iota(0, 5), 1, /*priority=*/1);  // other priority: not ranked
    e.Step();
    EXPECT_THAT(e.sched().RunningIds(),
                ElementsAre(policy == SchedulingPolicy::kFcfs ? 2 : 3));
    EXPECT_EQ(e.sched().stats().prefix_cache_uncacheable_tokens,
              policy == SchedulingPolicy::kFcfs ? 0 : 1);  // 13 % 4
    e.Run();
  }
}

TEST(ConfigTest, ParsesAndValidatesNewFields) {
  EXPECT_EQ(ParsePreemptionMode("auto").value(), PreemptionMode::kAuto);
  EXPECT_EQ(ParsePreemptionMode("recompute").value(),
            PreemptionMode::kRecompute);
  EXPECT_EQ(ParsePreemptionMode("swap").value(), PreemptionMode::kSwap);
  absl::StatusOr<PreemptionMode> bad = ParsePreemptionMode("disk");
  EXPECT_THAT(bad.status().message(), HasSubstr("--preemption-mode"));
  EXPECT_THAT(bad.status().message(), HasSubstr("auto, recompute or swap"));
  EXPECT_EQ(ParseSchedulingPolicy("cache-aware").value(),
            SchedulingPolicy::kCacheAware);
  EXPECT_THAT(ParseSchedulingPolicy("lifo").status().message(),
              HasSubstr("fcfs, priority or cache-aware"));
  EXPECT_EQ(PreemptionModeName(PreemptionMode::kSwap), "swap");
  EXPECT_EQ(SchedulingPolicyName(SchedulingPolicy::kCacheAware), "cache-aware");
  SchedulerConfig c = BaseConfig();
  c.num_swap_slots = -1;
  EXPECT_THAT(c.Validate().message(), HasSubstr("num_swap_slots"));
  c = BaseConfig();
  c.admission_high_watermark = 0;
  EXPECT_THAT(c.Validate().message(), HasSubstr("admission_high_watermark"));
  c = BaseConfig();
  c.thrash_preemption_limit = -2;
  EXPECT_THAT(c.Validate().message(), HasSubstr("thrash_preemption_limit"));
  c = BaseConfig();
  c.swap_seconds_per_block = -1;
  EXPECT_THAT(c.Validate().message(), HasSubstr("swap_seconds_per_block"));
  c = BaseConfig();
  c.recompute_seconds_per_token = std::numeric_limits<double>::infinity();
  EXPECT_THAT(c.Validate().message(), HasSubstr("recompute_seconds_per_token"));
}

// Seeded random arrivals with shared prefixes, forks, aborts and every
// preemption mode on a tight pool: the fake KV check and the invariants hold
// every step, and everything is free at the end.
TEST(SwapForkSoakTest, RandomLoadKeepsContentsAndInvariants) {
  for (const PreemptionMode mode :
       {PreemptionMode::kAuto, PreemptionMode::kSwap,
        PreemptionMode::kRecompute}) {
    SchedulerConfig c = BaseConfig();
    c.num_blocks = 40;
    c.max_num_batched_tokens = 40;
    c.long_prefill_token_threshold = 24;
    c.max_num_seqs = 8;
    c.max_model_len = 96;
    c.enable_prefix_caching = true;
    c.num_swap_slots = 24;
    c.preemption_mode = mode;
    c.recompute_seconds_per_token = 1e-4;
    c.swap_seconds_per_block = 1e-4;
    c.policy = mode == PreemptionMode::kAuto ? SchedulingPolicy::kCacheAware
                                             : SchedulingPolicy::kPriority;
    FakeEngine e(c);
    std::mt19937 rng(static_cast<int>(mode) + 5);
    auto pick = [&](int n) {
      return std::uniform_int_distribution<int>(0, n - 1)(rng);
    };
    RequestId next = 1;
    int forks = 0;
    for (int step = 0; step < 2000; ++step) {
      if (pick(3) == 0) {
        std::vector<int32_t> prompt = Iota(pick(3) * 1000, 1 + pick(40));
        prompt.push_back(static_cast<int32_t>(next));  // unique tail
        (void)e.sched().AddRequest(std::make_unique<Request>(
            next++, std::move(prompt), 1 + pick(30), pick(2)));
      }
      if (pick(30) == 0) (void)e.sched().Abort(1 + pick(next));
      if (pick(4) == 0) {
        const std::vector<RequestId> running = e.sched().RunningIds();
        if (!running.empty()) {
          const RequestId p = running[pick(running.size())];
          const Request* r = e.sched().GetRequest(p);
          // Fork only after the parent sampled its first token (a parent
          // one token short of its prompt has no output to replace).
          if (r->num_output_tokens() > 0 &&
              r->num_output_tokens() < r->max_tokens() &&
              r->num_computed_tokens() == r->num_tokens() - 1) {
            auto child = std::make_unique<Request>(next, r->prompt_token_ids(),
                                                   r->max_tokens());
            std::vector<int32_t> out = r->output_token_ids();
            out.back() = SampledToken(next, 0);
            child->set_output_token_ids(std::move(out));
            const absl::Status s = e.sched().Fork(p, std::move(child));
            ASSERT_TRUE(s.ok()) << s;
            ++next;
            ++forks;
          }
        }
      }
      e.Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    e.Run(5000);
    const SchedulerStats s = e.sched().stats();
    EXPECT_GT(forks, 100);
    EXPECT_GT(s.num_copied_blocks_total, 20);
    EXPECT_GT(s.num_preemptions_total, 10) << PreemptionModeName(mode);
    if (mode != PreemptionMode::kRecompute) {
      EXPECT_GT(s.num_preemptions_swap_total, 5) << PreemptionModeName(mode);
    } else {
      EXPECT_EQ(s.num_preemptions_swap_total, 0);
    }
    EXPECT_GT(s.prefix_cache_hit_tokens, 100);
    EXPECT_EQ(s.kv.free_blocks, c.num_blocks);
    EXPECT_EQ(s.swap_slots_used, 0);
  }
}

}  // namespace
}  // namespace kvserve::scheduler
