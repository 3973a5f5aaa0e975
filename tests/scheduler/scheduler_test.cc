#include "scheduler/scheduler.h"

#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Prompt token i of request `id`, and its k-th sampled token.
int32_t PromptToken(RequestId id, int32_t i) {
  return static_cast<int32_t>(id * 100 + i);
}
int32_t SampledToken(RequestId id, int32_t k) {
  return static_cast<int32_t>(100000 + id * 1000 + k);
}

std::unique_ptr<Request> MakeRequest(RequestId id, int32_t prompt_len,
                                     int32_t max_tokens, int32_t priority = 0) {
  std::vector<int32_t> prompt(prompt_len);
  for (int32_t i = 0; i < prompt_len; ++i) prompt[i] = PromptToken(id, i);
  return std::make_unique<Request>(id, std::move(prompt), max_tokens, priority);
}

SchedulerConfig SmallConfig() {
  SchedulerConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 100;
  c.block_size = 4;
  c.num_blocks = 6;
  c.watermark = 0.0;
  c.max_model_len = 64;
  // NOTE: these tables assume no prefix caching (a preempted request would
  // re-match its own blocks); tests/scheduler/prefix_caching_test.cc has it on.
  c.enable_prefix_caching = false;
  return c;
}

// One expected step: scheduled ids with their new-token counts, preempted
// ids, and (when given) the computed tokens the step's preemptions discarded
// (SchedulerOutput::stats.recomputed_tokens).
struct Row {
  int64_t step;
  std::vector<RequestId> scheduled;
  std::vector<int32_t> tokens;
  std::vector<RequestId> preempted = {};
  std::optional<int64_t> recomputed_tokens = std::nullopt;
};

// A step's StepStats must be the difference of the cumulative counters
// across its Schedule() call.
void ExpectStepStatsAreDifference(const SchedulerStats& before,
                                  const SchedulerStats& after,
                                  const StepStats& step) {
  EXPECT_EQ(step.preemptions_recompute,
            after.num_preemptions_recompute_total -
                before.num_preemptions_recompute_total);
  EXPECT_EQ(step.preemptions_swap, after.num_preemptions_swap_total -
                                       before.num_preemptions_swap_total);
  EXPECT_EQ(step.recomputed_tokens, after.num_recomputed_tokens_total -
                                        before.num_recomputed_tokens_total);
  EXPECT_EQ(
      step.prefix_cache_queries_tokens,
      after.prefix_cache_queries_tokens - before.prefix_cache_queries_tokens);
  EXPECT_EQ(step.prefix_cache_hit_tokens,
            after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens);
  EXPECT_EQ(step.prefix_cache_uncacheable_tokens,
            after.prefix_cache_uncacheable_tokens -
                before.prefix_cache_uncacheable_tokens);
}

// A scheduler driven by a fake model runner. The fake writes (request,
// position, token) into a fake KV pool at each new token's slot, checks the
// fed tokens, and before sampling checks that every earlier position of the
// request still holds what it wrote: stale or shared blocks and missed
// recomputation after preemption show up as mismatches. Each request that
// produces a token gets SampledToken(id, its output count).
class Harness {
 public:
  explicit Harness(const SchedulerConfig& config)
      : sched_(config),
        block_size_(config.block_size),
        slots_(static_cast<size_t>(config.num_blocks) * config.block_size) {}

  Scheduler& sched() { return sched_; }

  void Add(RequestId id, int32_t prompt_len, int32_t max_tokens,
           int32_t priority = 0) {
    const absl::Status s =
        sched_.AddRequest(MakeRequest(id, prompt_len, max_tokens, priority));
    EXPECT_TRUE(s.ok()) << s;
  }

  // Schedule, run the fake model, update. Invariants checked around it.
  SchedulerOutput Step() {
    CheckInvariants();
    const SchedulerStats before = sched_.stats();
    SchedulerOutput out = sched_.Schedule();
    ExpectStepStatsAreDifference(before, sched_.stats(), out.stats);
    CheckInvariants();
    std::vector<int32_t> sampled;
    for (const ScheduledRequest& s : out.scheduled) {
      RunFake(out, s);
      if (s.produces_token) {
        const Request* r = sched_.GetRequest(s.id);
        sampled.push_back(SampledToken(s.id, r->num_output_tokens()));
      }
    }
    finished_ = sched_.UpdateFromOutput(out, sampled);
    CheckInvariants();
    return out;
  }

  // Runs the rows in order; each must match the next step exactly.
  void ExpectSteps(const std::vector<Row>& rows) {
    for (const Row& row : rows) {
      SCOPED_TRACE(::testing::Message() << "step " << row.step);
      const SchedulerOutput out = Step();
      std::vector<RequestId> ids;
      std::vector<int32_t> tokens;
      for (const ScheduledRequest& s : out.scheduled) {
        ids.push_back(s.id);
        tokens.push_back(s.num_new_tokens);
      }
      EXPECT_EQ(out.step, row.step);
      EXPECT_THAT(ids, ElementsAreArray(row.scheduled));
      EXPECT_THAT(tokens, ElementsAreArray(row.tokens));
      EXPECT_THAT(out.preempted, ElementsAreArray(row.preempted));
      EXPECT_EQ(out.stats.preemptions_recompute + out.stats.preemptions_swap,
                static_cast<int64_t>(row.preempted.size()));
      if (row.recomputed_tokens.has_value()) {
        EXPECT_EQ(out.stats.recomputed_tokens, *row.recomputed_tokens);
      }
    }
  }

  // Steps until no work is left (at most `max_steps`).
  void RunToCompletion(int max_steps = 10000) {
    for (int i = 0; i < max_steps && sched_.has_work(); ++i) Step();
    EXPECT_FALSE(sched_.has_work());
  }

  const std::vector<FinishedRequest>& finished() const { return finished_; }

 private:
  struct Slot {
    RequestId id = -1;
    int32_t position = -1;
    int32_t token = -1;
  };

  Slot& SlotAt(const SchedulerOutput& out, const ScheduledRequest& s,
               int32_t position) {
    const int32_t block = out.BlockTable(s).at(position / block_size_);
    return slots_.at(static_cast<size_t>(block) * block_size_ +
                     position % block_size_);
  }

  void RunFake(const SchedulerOutput& out, const ScheduledRequest& s) {
    const Request* r = sched_.GetRequest(s.id);
    ASSERT_NE(r, nullptr);
    const absl::Span<const int32_t> token_ids = out.TokenIds(s);
    ASSERT_EQ(token_ids.size(), static_cast<size_t>(s.num_new_tokens));
    ASSERT_EQ(s.start_position + s.num_new_tokens, r->num_computed_tokens());
    for (int32_t k = 0; k < s.num_new_tokens; ++k) {
      const int32_t pos = s.start_position + k;
      ASSERT_EQ(token_ids[k], r->token(pos)) << "request " << s.id;
      SlotAt(out, s, pos) = {s.id, pos, token_ids[k]};
    }
    if (!s.produces_token) return;
    ASSERT_EQ(r->num_computed_tokens(), r->num_tokens());
    for (int32_t pos = 0; pos < r->num_tokens(); ++pos) {
      const Slot& slot = SlotAt(out, s, pos);
      ASSERT_TRUE(slot.id == s.id && slot.position == pos &&
                  slot.token == r->token(pos))
          << "request " << s.id << " position " << pos << " holds request "
          << slot.id << " position " << slot.position;
    }
  }

  void CheckInvariants() {
    const absl::Status s = sched_.CheckInvariants();
    ASSERT_TRUE(s.ok()) << s;
  }

  Scheduler sched_;
  int32_t block_size_;
  std::vector<Slot> slots_;
  std::vector<FinishedRequest> finished_;
};

std::vector<RequestId> FinishedIds(const std::vector<FinishedRequest>& f) {
  std::vector<RequestId> ids;
  for (const FinishedRequest& r : f) ids.push_back(r.id);
  return ids;
}

TEST(SchedulerTest, ChunkedPrefillAcrossSteps) {
  SchedulerConfig c = SmallConfig();
  c.block_size = 16;
  c.num_blocks = 20;
  c.max_num_batched_tokens = 32;
  Harness h(c);
  h.Add(1, 50, 3);
  h.Add(2, 10, 2);

  SchedulerOutput out = h.Step();  // step 0: 32 of request 1's 50
  ASSERT_EQ(out.scheduled.size(), 1u);
  const ScheduledRequest& s0 = out.scheduled[0];
  EXPECT_EQ(s0.start_position, 0);
  EXPECT_FALSE(s0.produces_token);
  EXPECT_EQ(out.TokenIds(s0).front(), PromptToken(1, 0));
  EXPECT_EQ(out.TokenIds(s0).back(), PromptToken(1, 31));
  EXPECT_THAT(out.BlockTable(s0), ElementsAre(0, 1));
  EXPECT_EQ(out.total_num_tokens, 32);
  EXPECT_EQ(h.sched().stats().last_admission_stop, AdmissionStop::kTokenBudget);

  out = h.Step();  // step 1: the last 18 of request 1, all 10 of request 2
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].start_position, 32);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 18);
  EXPECT_TRUE(out.scheduled[0].produces_token);
  EXPECT_THAT(out.BlockTable(out.scheduled[0]), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 10);
  EXPECT_TRUE(out.scheduled[1].produces_token);
  EXPECT_THAT(out.BlockTable(out.scheduled[1]), ElementsAre(4));
  EXPECT_EQ(out.scheduled[1].token_offset, 18);  // flat layout
  EXPECT_EQ(out.scheduled[1].block_offset, 4);
  EXPECT_EQ(out.token_ids.size(), 28u);
  EXPECT_EQ(out.token_ids[18], PromptToken(2, 0));
  EXPECT_THAT(out.block_ids, ElementsAre(0, 1, 2, 3, 4));

  out = h.Step();  // step 2: decodes feed the sampled tokens
  EXPECT_EQ(out.scheduled[0].start_position, 50);
  EXPECT_THAT(out.TokenIds(out.scheduled[0]), ElementsAre(SampledToken(1, 0)));
  EXPECT_THAT(out.TokenIds(out.scheduled[1]), ElementsAre(SampledToken(2, 0)));
  EXPECT_THAT(FinishedIds(h.finished()), ElementsAre(2));
  EXPECT_EQ(h.finished()[0].reason, FinishReason::kLength);

  h.ExpectSteps({{3, {1}, {1}}});
  EXPECT_THAT(FinishedIds(h.finished()), ElementsAre(1));
  EXPECT_FALSE(h.sched().has_work());
  EXPECT_EQ(h.sched().kv_usage().active_blocks, 0);
  EXPECT_EQ(h.sched().stats().last_admission_stop, AdmissionStop::kQueueEmpty);
}

TEST(SchedulerTest, LongPrefillThresholdCapsChunks) {
  SchedulerConfig c = SmallConfig();
  c.long_prefill_token_threshold = 8;
  c.max_num_batched_tokens = 32;
  Harness h(c);
  h.Add(1, 20, 2);
  h.Add(2, 3, 1);
  h.ExpectSteps({
      {0, {1, 2}, {8, 3}},
      {1, {1}, {8}},
      {2, {1}, {4}},
      {3, {1}, {1}},
  });
  EXPECT_FALSE(h.sched().has_work());
}

// With the default budget and threshold, a short request that arrives
// while a long prompt prefills runs in the next step, beside the long
// prompt's next chunk, rather than after the whole prefill.
TEST(SchedulerTest, ShortRequestJoinsALongPrefillByDefault) {
  const SchedulerConfig defaults;
  SchedulerConfig c = SmallConfig();
  c.max_num_batched_tokens = defaults.max_num_batched_tokens;  // 512
  c.long_prefill_token_threshold = defaults.long_prefill_token_threshold;
  c.num_blocks = 1000;
  c.max_model_len = 4096;
  Harness h(c);
  h.Add(1, 2000, 1);
  h.ExpectSteps({{0, {1}, {256}}});
  h.Add(2, 4, 1);
  h.ExpectSteps({
      {1, {1, 2}, {256, 4}},
      {2, {1}, {256}},
  });
}

TEST(SchedulerTest, MaxNumSeqsLimitsRunning) {
  SchedulerConfig c = SmallConfig();
  c.max_num_seqs = 2;
  c.num_blocks = 20;
  Harness h(c);
  h.Add(1, 4, 2);
  h.Add(2, 4, 2);
  h.Add(3, 4, 2);
  h.ExpectSteps({{0, {1, 2}, {4, 4}}});
  EXPECT_EQ(h.sched().num_running(), 2);
  EXPECT_THAT(h.sched().WaitingIds(), ElementsAre(3));
  EXPECT_EQ(h.sched().stats().last_admission_stop, AdmissionStop::kMaxNumSeqs);
  h.ExpectSteps({
      {1, {1, 2}, {1, 1}},
      {2, {3}, {4}},
      {3, {3}, {1}},
  });
  EXPECT_FALSE(h.sched().has_work());
}

TEST(SchedulerTest, WatermarkBlocksAdmissionNotGrowth) {
  SchedulerConfig c = SmallConfig();
  c.block_size = 16;
  c.num_blocks = 10;
  c.watermark = 0.2;  // 2 blocks
  c.max_num_batched_tokens = 256;
  c.max_model_len = 256;
  Harness h(c);
  h.Add(1, 64, 2);
  h.Add(2, 64, 2);
  h.Add(3, 16, 1);
  // 10 - 4 - 4 = 2 free: request 3 would leave 1 < 2.
  SchedulerOutput out = h.Step();
  EXPECT_THAT(out.BlockTable(out.scheduled[0]), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(out.BlockTable(out.scheduled[1]), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(h.sched().WaitingIds(), ElementsAre(3));
  EXPECT_EQ(h.sched().stats().last_admission_stop, AdmissionStop::kKvBlocks);
  // Running requests grow into the watermark.
  out = h.Step();
  EXPECT_THAT(out.BlockTable(out.scheduled[0]), ElementsAre(0, 1, 2, 3, 8));
  EXPECT_THAT(out.BlockTable(out.scheduled[1]), ElementsAre(4, 5, 6, 7, 9));
  EXPECT_THAT(FinishedIds(h.finished()), ElementsAre(1, 2));
  // Freed tail-first: 8 3 2 1 0 9 7 6 5 4; request 3 takes the queue head.
  EXPECT_THAT(h.sched().kv_cache().pool().FreeQueue(),
              ElementsAre(8, 3, 2, 1, 0, 9, 7, 6, 5, 4));
  out = h.Step();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].id, 3);
  EXPECT_THAT(out.BlockTable(out.scheduled[0]), ElementsAre(8));
}

// FCFS: when a running request cannot grow, the most recently admitted one
// is preempted, re-queued at the head, and later recomputes prompt + output.
TEST(SchedulerTest, PreemptsMostRecentlyAdmittedAndRecomputes) {
  Harness h(SmallConfig());  // 6 blocks of 4 tokens
  h.Add(1, 8, 8);
  h.Add(2, 8, 8);
  h.Add(3, 4, 4);
  h.ExpectSteps({
      {0, {1, 2, 3}, {8, 8, 4}},    // blocks 1:{0,1} 2:{2,3} 3:{4}
      {1, {1, 2}, {1, 1}, {3}, 4},  // 1 takes 5; 2 needs one: 3 goes
      {2, {1, 2}, {1, 1}},          // 3 waits: 5 tokens need 2 blocks, 0 free
      {3, {1, 2}, {1, 1}},
      {4, {1, 2}, {1, 1}},
      {5, {1}, {1}, {2}, 12},  // 1 needs a 4th block: 2 (newest) goes
  });
  EXPECT_THAT(h.sched().WaitingIds(), ElementsAre(2, 3));  // 2 at the head
  EXPECT_EQ(h.sched().stats().last_admission_stop, AdmissionStop::kPreempted);
  const Request* r2 = h.sched().GetRequest(2);
  EXPECT_EQ(r2->status(), RequestStatus::kPreempted);
  EXPECT_EQ(r2->num_computed_tokens(), 0);
  EXPECT_EQ(r2->num_output_tokens(), 5);  // kept for recompute
  EXPECT_EQ(r2->num_preemptions(), 1);
  EXPECT_THAT(h.sched().kv_cache().pool().FreeQueue(), ElementsAre(3, 2));

  h.ExpectSteps({
      {6, {1}, {1}},  // 2 needs 4 blocks for 13 tokens, 2 free
      {7, {1}, {1}},  // 1 reaches max_tokens and frees 0 1 5 4
  });
  EXPECT_THAT(FinishedIds(h.finished()), ElementsAre(1));

  SchedulerOutput out = h.Step();  // step 8: both re-admitted, recomputing
  ASSERT_EQ(out.scheduled.size(), 2u);
  const ScheduledRequest& s2 = out.scheduled[0];
  EXPECT_EQ(s2.id, 2);
  EXPECT_EQ(s2.start_position, 0);
  EXPECT_EQ(s2.num_new_tokens, 13);
  EXPECT_EQ(out.TokenIds(s2)[7], PromptToken(2, 7));
  EXPECT_EQ(out.TokenIds(s2)[8], SampledToken(2, 0));
  EXPECT_EQ(out.TokenIds(s2)[12], SampledToken(2, 4));
  EXPECT_TRUE(s2.produces_token);
  EXPECT_THAT(out.BlockTable(s2), ElementsAre(3, 2, 4, 5));
  EXPECT_EQ(out.scheduled[1].id, 3);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 5);
  EXPECT_THAT(out.BlockTable(out.scheduled[1]), ElementsAre(1, 0));

  h.ExpectSteps({
      {9, {2, 3}, {1, 1}},
      {10, {2, 3}, {1, 1}},
  });
  EXPECT_THAT(FinishedIds(h.finished()), ElementsAre(2, 3));
  const SchedulerStats st = h.sched().stats();
  EXPECT_EQ(st.num_preemptions_total, 2);
  EXPECT_EQ(st.num_preempted_tokens_total, 4 + 12);
  EXPECT_EQ(st.num_finished_total, 3);
  EXPECT_EQ(st.kv.free_blocks, 6);
}

TEST(SchedulerTest, PriorityPolicyAdmitsByPriority) {
  SchedulerConfig c = SmallConfig();
  c.policy = SchedulingPolicy::kPriority;
  c.max_num_seqs = 1;
  Harness h(c);
  h.Add(1, 4, 1, /*priority=*/5);
  h.Add(2, 4, 1, /*priority=*/1);
  h.Add(3, 4, 1, /*priority=*/3);
  h.Add(4, 4, 1, /*priority=*/1);
  EXPECT_THAT(h.sched().WaitingIds(), ElementsAre(2, 4, 3, 1));
  h.ExpectSteps({
      {0, {2}, {4}},
      {1, {4}, {4}},
      {2, {3}, {4}},
      {3, {1}, {4}},
  });
}

// Priority: the victim is the least important running request, even when it
// was admitted first (FCFS would pick the newest).
TEST(SchedulerTest, PriorityPreemptsLeastImportant) {
  SchedulerConfig c = SmallConfig();
  c.policy = SchedulingPolicy::kPriority;
  c.num_blocks = 4;
  Harness h(c);
  h.Add(1, 4, 8, /*priority=*/5);
  h.ExpectSteps({{0, {1}, {4}}});
  h.Add(2, 4, 8, /*priority=*/0);
  h.ExpectSteps({
      {1, {1, 2}, {1, 4}},
      {2, {1, 2}, {1, 1}},
      {3, {1, 2}, {1, 1}},
      {4, {1, 2}, {1, 1}},
      {5, {2}, {1}, {1}},  // 1 needs a 3rd block: it is the victim
      {6, {2}, {1}},
      {7, {2}, {1}},
      {8, {2}, {1}},
      {9, {1}, {9}},  // 4 prompt + 5 output tokens recomputed
  });
}

// Priority: a victim already planned earlier in the step is unplanned and
// its tokens return to the budget.
TEST(SchedulerTest, PriorityVictimAlreadyPlannedThisStep) {
  SchedulerConfig c = SmallConfig();
  c.policy = SchedulingPolicy::kPriority;
  c.num_blocks = 3;
  Harness h(c);
  h.Add(1, 5, 7, /*priority=*/5);
  h.ExpectSteps({{0, {1}, {5}}});
  h.Add(2, 4, 8, /*priority=*/0);
  h.ExpectSteps({{1, {1, 2}, {1, 4}}});
  // Step 2: 1 fits its 2 blocks and is planned; 2 then needs a block, none
  // is free, and 1 (priority 5) is the victim.
  const SchedulerOutput out = h.Step();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].id, 2);
  EXPECT_THAT(out.preempted, ElementsAre(1));
  EXPECT_EQ(out.total_num_tokens, 1);
  EXPECT_THAT(out.BlockTable(out.scheduled[0]), ElementsAre(2, 1));
  h.RunToCompletion();
  EXPECT_EQ(h.sched().stats().num_preemptions_total, 1);
}

TEST(SchedulerTest, FcfsPicksNewestEvenIfMoreImportant) {
  SchedulerConfig c = SmallConfig();
  c.num_blocks = 4;
  Harness h(c);
  h.Add(1, 4, 8, /*priority=*/5);
  h.ExpectSteps({{0, {1}, {4}}});
  h.Add(2, 4, 8, /*priority=*/0);
  h.ExpectSteps({
      {1, {1, 2}, {1, 4}},
      {2, {1, 2}, {1, 1}},
      {3, {1, 2}, {1, 1}},
      {4, {1, 2}, {1, 1}},
      {5, {1}, {1}, {2}},
  });
}

TEST(SchedulerTest, AbortWaitingAndRunningFreesBlocksAtOnce) {
  SchedulerConfig c = SmallConfig();
  c.max_num_seqs = 1;
  Harness h(c);
  h.Add(1, 8, 4);
  h.Add(2, 8, 4);
  h.ExpectSteps({{0, {1}, {8}}});
  EXPECT_EQ(h.sched().kv_usage().active_blocks, 2);

  EXPECT_TRUE(h.sched().Abort(2).ok());  // waiting
  EXPECT_EQ(h.sched().num_waiting(), 0);
  EXPECT_TRUE(h.sched().Abort(1).ok());  // running
  EXPECT_EQ(h.sched().num_running(), 0);
  EXPECT_EQ(h.sched().kv_usage().active_blocks, 0);
  EXPECT_TRUE(h.sched().CheckInvariants().ok());
  EXPECT_EQ(h.sched().Abort(1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h.sched().stats().num_aborted_total, 2);
  EXPECT_FALSE(h.sched().has_work());
}

TEST(SchedulerTest, AbortBetweenScheduleAndUpdateDropsToken) {
  Scheduler sched(SmallConfig());
  ASSERT_TRUE(sched.AddRequest(MakeRequest(1, 4, 3)).ok());
  ASSERT_TRUE(sched.AddRequest(MakeRequest(2, 4, 3)).ok());
  const SchedulerOutput out = sched.Schedule();
  ASSERT_EQ(out.num_producing(), 2);
  ASSERT_TRUE(sched.Abort(1).ok());
  EXPECT_EQ(sched.kv_usage().active_blocks, 1);
  const std::vector<int32_t> sampled = {7, 8};
  EXPECT_THAT(sched.UpdateFromOutput(out, sampled), IsEmpty());
  EXPECT_THAT(sched.GetRequest(2)->output_token_ids(), ElementsAre(8));
  EXPECT_TRUE(sched.CheckInvariants().ok());
}

TEST(SchedulerTest, EngineFinishOnStopCondition) {
  Harness h(SmallConfig());
  h.Add(1, 4, 10);
  h.Step();
  ASSERT_TRUE(h.sched().Finish(1, FinishReason::kStop).ok());
  EXPECT_EQ(h.sched().GetRequest(1), nullptr);
  EXPECT_EQ(h.sched().kv_usage().active_blocks, 0);
  EXPECT_EQ(h.sched().stats().num_finished_total, 1);
  EXPECT_EQ(h.sched().stats().num_aborted_total, 0);
}

TEST(SchedulerTest, RequestThatCanNeverFitIsOutOfRange) {
  SchedulerConfig c = SmallConfig();  // 6 blocks of 4, max_model_len 64
  Scheduler sched(c);
  absl::Status s = sched.AddRequest(MakeRequest(1, 20, 5));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("25 tokens need 7 KV blocks of 4"));
  EXPECT_THAT(s.message(), HasSubstr("the pool has 6 blocks"));
  EXPECT_TRUE(sched.AddRequest(MakeRequest(1, 20, 4)).ok());  // 6 blocks

  c.watermark = 0.34;  // 2 blocks kept free: 4 usable
  Scheduler sched2(c);
  s = sched2.AddRequest(MakeRequest(1, 17, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("2 kept free by the watermark, 4 usable"));

  EXPECT_FALSE(sched2.has_work());
}

// Past the model's context is a bad argument (no pool makes it fit), with
// the field named: the prompt alone, or the prompt with max_tokens.
TEST(SchedulerTest, RequestPastTheContextIsInvalid) {
  SchedulerConfig c = SmallConfig();
  c.max_model_len = 16;
  Scheduler sched(c);
  absl::Status s = sched.AddRequest(MakeRequest(1, 10, 7));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("max_tokens: prompt (10 tokens) + max_tokens (7) "
                        "exceeds the model's context of 16"));
  s = sched.AddRequest(MakeRequest(1, 16, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("prompt: 16 tokens, over the model's "
                                     "context of 16"));
  EXPECT_TRUE(sched.AddRequest(MakeRequest(1, 10, 6)).ok());
}

TEST(SchedulerTest, FullQueueIsResourceExhausted) {
  SchedulerConfig c = SmallConfig();
  c.max_queued_requests = 2;
  c.max_num_seqs = 1;
  Scheduler sched(c);
  ASSERT_TRUE(sched.AddRequest(MakeRequest(1, 4, 1)).ok());
  ASSERT_TRUE(sched.AddRequest(MakeRequest(2, 4, 1)).ok());
  const absl::Status s = sched.AddRequest(MakeRequest(3, 4, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("max_queued_requests=2"));
  const SchedulerOutput out = sched.Schedule();  // admits 1: room for one
  EXPECT_TRUE(sched.AddRequest(MakeRequest(3, 4, 1)).ok());
  EXPECT_EQ(sched.num_waiting(), 2);
  (void)sched.UpdateFromOutput(out, std::vector<int32_t>{5});
}

TEST(SchedulerTest, RejectsInvalidRequestsAndConfigs) {
  Scheduler sched(SmallConfig());
  EXPECT_EQ(sched.AddRequest(nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.AddRequest(MakeRequest(1, 0, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched.AddRequest(MakeRequest(1, 4, 0)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(sched.AddRequest(MakeRequest(1, 4, 1)).ok());
  EXPECT_EQ(sched.AddRequest(MakeRequest(1, 4, 1)).code(),
            absl::StatusCode::kAlreadyExists);

  SchedulerConfig bad = SmallConfig();
  bad.num_blocks = 0;
  auto created = Scheduler::Create(bad);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(created.status().message(), HasSubstr("num_blocks"));
  bad = SmallConfig();
  bad.watermark = 1.0;
  EXPECT_FALSE(Scheduler::Create(bad).ok());
  EXPECT_TRUE(Scheduler::Create(SmallConfig()).ok());
  EXPECT_EQ(ParseSchedulingPolicy("priority").value(),
            SchedulingPolicy::kPriority);
  EXPECT_FALSE(ParseSchedulingPolicy("lifo").ok());
}

// max_model_len 18 at block size 4: a slab is ceil(18 / 4) = 5 blocks, so a
// 6-block pool holds one slab.
SchedulerConfig MaxLengthConfig() {
  SchedulerConfig c = SmallConfig();
  c.max_model_len = 18;
  c.kv_reservation = KvReservation::kMaxLength;
  return c;
}

int64_t Blocks(const Scheduler& sched, RequestId id) {
  return static_cast<int64_t>(sched.kv_cache().GetBlockTable(id).size());
}

TEST(SchedulerTest, MaxLengthHoldsAWholeSlabFromAdmission) {
  const SchedulerConfig c = MaxLengthConfig();
  EXPECT_EQ(c.slab_blocks(), 5);
  Harness h(c);
  h.Add(1, 3, 3);  // 6 tokens: 2 blocks when paged
  h.ExpectSteps({{0, {1}, {3}}});
  EXPECT_EQ(Blocks(h.sched(), 1), 5);
  EXPECT_EQ(h.sched().kv_usage().free_blocks, 1);
  h.ExpectSteps({{1, {1}, {1}}});  // decoding allocates nothing more
  EXPECT_EQ(Blocks(h.sched(), 1), 5);
  h.ExpectSteps({{2, {1}, {1}}});
  EXPECT_THAT(FinishedIds(h.finished()), ElementsAre(1));
  EXPECT_EQ(h.sched().kv_usage().free_blocks, 6);
}

TEST(SchedulerTest, MaxLengthWaitsForAFreeSlab) {
  Harness h(MaxLengthConfig());
  h.Add(1, 3, 2);
  h.Add(2, 3, 2);
  // Two small requests need 2 blocks each, but a slab is 5 of 6 blocks.
  h.ExpectSteps({{0, {1}, {3}}});
  EXPECT_EQ(h.sched().stats().last_admission_stop, AdmissionStop::kKvBlocks);
  EXPECT_THAT(h.sched().WaitingIds(), ElementsAre(2));
  h.ExpectSteps({{1, {1}, {1}}});  // 1 finishes and frees its slab
  h.ExpectSteps({{2, {2}, {3}}});
  EXPECT_EQ(Blocks(h.sched(), 2), 5);
  h.RunToCompletion();
  EXPECT_EQ(h.sched().stats().num_preemptions_total, 0);
}

TEST(SchedulerTest, PagedAdmitsWhatMaxLengthMakesWait) {
  SchedulerConfig c = MaxLengthConfig();
  c.kv_reservation = KvReservation::kPaged;
  Harness h(c);
  h.Add(1, 3, 2);
  h.Add(2, 3, 2);
  h.ExpectSteps({{0, {1, 2}, {3, 3}}});
  EXPECT_EQ(Blocks(h.sched(), 1), 1);
  EXPECT_EQ(Blocks(h.sched(), 2), 1);
  h.RunToCompletion();
}

TEST(SchedulerTest, MaxLengthSlabMustFitThePool) {
  SchedulerConfig c = MaxLengthConfig();
  c.max_model_len = 28;  // 7 blocks > 6
  Scheduler sched(c);
  const absl::Status s = sched.AddRequest(MakeRequest(1, 3, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_EQ(ParseKvReservation("max-length").value(),
            KvReservation::kMaxLength);
  EXPECT_EQ(ParseKvReservation("paged").value(), KvReservation::kPaged);
  EXPECT_FALSE(ParseKvReservation("slab").ok());
  for (KvReservation r : {KvReservation::kPaged, KvReservation::kMaxLength}) {
    EXPECT_EQ(ParseKvReservation(KvReservationName(r)).value(), r);
  }
}

TEST(SchedulerTest, EmptyScheduleWithoutWork) {
  Scheduler sched(SmallConfig());
  const SchedulerOutput out = sched.Schedule();
  EXPECT_TRUE(out.empty());
  EXPECT_THAT(sched.UpdateFromOutput(out, {}), IsEmpty());
  EXPECT_TRUE(sched.Schedule().empty());  // no update owed for an empty step
}

TEST(SchedulerDeathTest, ScheduleTwiceWithoutUpdateAborts) {
  Scheduler sched(SmallConfig());
  ASSERT_TRUE(sched.AddRequest(MakeRequest(1, 4, 2)).ok());
  const SchedulerOutput out = sched.Schedule();
  EXPECT_DEATH((void)sched.Schedule(), "before UpdateFromOutput");
  EXPECT_DEATH((void)sched.UpdateFromOutput(out, {}), "sampled has 0");
}

// Seeded random arrivals, aborts and stop-finishes on a tight pool, both
// policies: invariants and the fake KV check every step (so recomputation
// after preemption feeds and stores exactly the request's tokens), and the
// pool is all free at the end.
TEST(SchedulerSoakTest, RandomLoadKeepsInvariants) {
  for (const SchedulingPolicy policy :
       {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority}) {
    SchedulerConfig c;
    c.max_num_seqs = 8;
    c.max_num_batched_tokens = 40;
    c.block_size = 4;
    c.num_blocks = 40;
    c.watermark = 0.05;
    c.long_prefill_token_threshold = 24;
    c.max_queued_requests = 16;
    c.max_model_len = 96;
    c.policy = policy;
    c.enable_prefix_caching = false;
    Harness h(c);
    std::mt19937 rng(policy == SchedulingPolicy::kFcfs ? 1 : 2);
    auto pick = [&](int n) {
      return std::uniform_int_distribution<int>(0, n - 1)(rng);
    };
    RequestId next_id = 1;
    int64_t length_finished = 0, rejected = 0;
    for (int step = 0; step < 3000; ++step) {
      if (pick(3) == 0) {
        const absl::Status s = h.sched().AddRequest(MakeRequest(
            next_id++, 1 + pick(60), 1 + pick(40), /*priority=*/pick(3)));
        rejected += s.ok() ? 0 : 1;
      }
      if (pick(40) == 0 && next_id > 1) {
        (void)h.sched().Abort(1 + pick(static_cast<int>(next_id - 1)));
      }
      if (pick(40) == 0 && next_id > 1) {
        (void)h.sched().Finish(1 + pick(static_cast<int>(next_id - 1)),
                               FinishReason::kStop);
      }
      h.Step();
      if (::testing::Test::HasFatalFailure()) return;
      for (const FinishedRequest& f : h.finished()) {
        EXPECT_EQ(f.reason, FinishReason::kLength);
        ++length_finished;
      }
    }
    h.RunToCompletion();
    EXPECT_GT(length_finished, 300);
    EXPECT_GT(rejected, 0);  // OUT_OF_RANGE or a full queue
    EXPECT_GT(h.sched().stats().num_preemptions_total, 20);
    EXPECT_EQ(h.sched().kv_usage().free_blocks, c.num_blocks);
  }
}

}  // namespace
}  // namespace kvserve::scheduler
