// Per-request KV accounting (Request::kv_stats, FinishedRequest::kv_stats),
// preemption reasons, and priority preemption at admission. A minimal
// driver feeds each producing request a token; what the scheduler reports
// is checked against what the step outputs showed.
#include <map>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

SchedulerConfig TinyConfig() {
  SchedulerConfig c;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 100;
  c.block_size = 4;
  c.num_blocks = 4;
  c.watermark = 0.0;
  c.max_model_len = 64;
  c.enable_prefix_caching = false;
  return c;
}

class Driver {
 public:
  explicit Driver(const SchedulerConfig& c) : sched_(c) {}
  Scheduler& sched() { return sched_; }

  void Add(RequestId id, int32_t prompt_len, int32_t max_tokens,
           int32_t priority = 0) {
    std::vector<int32_t> prompt(prompt_len);
    for (int32_t i = 0; i < prompt_len; ++i) prompt[i] = 1000 + i;
    ASSERT_TRUE(sched_
                    .AddRequest(std::make_unique<Request>(id, std::move(prompt),
                                                          max_tokens, priority))
                    .ok());
  }

  SchedulerOutput Step() {
    SchedulerOutput out = sched_.Schedule();
    EXPECT_TRUE(sched_.CheckInvariants().ok());
    std::vector<int32_t> sampled(out.num_producing(), 7);
    for (const ScheduledRequest& s : out.scheduled) {
      peak_[s.id] = std::max(peak_[s.id], s.num_blocks);
    }
    swapped_out_ += static_cast<int64_t>(out.blocks_to_swap_out.size());
    swapped_in_ += static_cast<int64_t>(out.blocks_to_swap_in.size());
    priority_ += out.stats.priority_preemptions_recompute +
                 out.stats.priority_preemptions_swap;
    for (const FinishedRequest& f : sched_.UpdateFromOutput(out, sampled)) {
      finished_[f.id] = f.kv_stats;
    }
    return out;
  }
  void Run() {
    for (int i = 0; i < 1000 && sched_.has_work(); ++i) Step();
    ASSERT_FALSE(sched_.has_work());
  }

  std::map<RequestId, RequestKvStats> finished_;
  std::map<RequestId, int32_t> peak_;  // most blocks seen scheduled
  int64_t swapped_out_ = 0, swapped_in_ = 0, priority_ = 0;

 private:
  Scheduler sched_;
};

// Two requests outgrow four blocks: the newest is recomputed once, and its
// accounting says so; the other never lost anything.
TEST(KvAccountingTest, RecomputePreemptionIsChargedToTheVictim) {
  Driver d(TinyConfig());
  d.Add(1, 4, 8);
  d.Add(2, 4, 8);
  d.Run();
  ASSERT_EQ(d.finished_.size(), 2u);
  const RequestKvStats& a = d.finished_[1];
  const RequestKvStats& b = d.finished_[2];
  EXPECT_EQ(a.preemptions_recompute + a.preemptions_swap, 0);
  EXPECT_EQ(b.preemptions_recompute, 1);
  EXPECT_EQ(b.preemptions_swap, 0);
  EXPECT_EQ(b.recomputed_tokens, d.sched().stats().num_recomputed_tokens_total);
  EXPECT_GT(b.recomputed_tokens, 4);
  // 4 prompt + 8 output tokens: 3 blocks at the end, the most either held.
  EXPECT_EQ(a.peak_blocks, 3);
  EXPECT_EQ(a.peak_blocks, d.peak_[1]);
  EXPECT_EQ(b.peak_blocks, d.peak_[2]);
  EXPECT_EQ(d.sched().stats().num_priority_preemptions_recompute_total, 0);
}

TEST(KvAccountingTest, SwapPreemptionCountsBlocksOutAndIn) {
  SchedulerConfig c = TinyConfig();
  c.num_swap_slots = 8;
  c.preemption_mode = PreemptionMode::kSwap;
  Driver d(c);
  d.Add(1, 4, 8);
  d.Add(2, 4, 8);
  d.Run();
  const RequestKvStats& b = d.finished_[2];
  EXPECT_EQ(b.preemptions_swap, 1);
  EXPECT_EQ(b.preemptions_recompute, 0);
  EXPECT_EQ(b.recomputed_tokens, 0);
  EXPECT_GT(b.swapped_out_blocks, 0);
  EXPECT_EQ(b.swapped_out_blocks, b.swapped_in_blocks);
  EXPECT_EQ(b.swapped_out_blocks + d.finished_[1].swapped_out_blocks,
            d.swapped_out_);
  EXPECT_EQ(d.swapped_out_, d.swapped_in_);
}

// Priority policy: a waiting request of higher priority that does not fit
// preempts the less important running one (reason: priority) and runs next
// step; nothing else is admitted in the preempting step.
TEST(KvAccountingTest, PriorityHeadPreemptsLessImportantRunning) {
  SchedulerConfig c = TinyConfig();
  c.policy = SchedulingPolicy::kPriority;
  Driver d(c);
  d.Add(1, 8, 4, /*priority=*/5);  // 2 blocks, then a 3rd
  EXPECT_THAT(d.Step().preempted, IsEmpty());
  d.Add(2, 12, 2, /*priority=*/0);  // needs 3 blocks: only 2 are free
  const SchedulerOutput out = d.Step();
  EXPECT_THAT(out.preempted, ElementsAre(1));
  EXPECT_EQ(out.stats.priority_preemptions_recompute, 1);
  EXPECT_EQ(out.stats.preemptions_recompute, 1);
  EXPECT_TRUE(out.scheduled.empty());
  EXPECT_EQ(d.sched().stats().last_admission_stop, AdmissionStop::kPreempted);
  const SchedulerOutput next = d.Step();
  ASSERT_FALSE(next.scheduled.empty());
  EXPECT_EQ(next.scheduled[0].id, 2);
  d.Run();
  EXPECT_EQ(d.finished_[1].preemptions_recompute, 1);
  EXPECT_EQ(d.finished_[2].preemptions_recompute, 0);
  EXPECT_EQ(d.sched().stats().num_priority_preemptions_recompute_total, 1);
  EXPECT_EQ(d.priority_, 1);
}

// An equally or less important head waits instead; FCFS never preempts for
// admission.
TEST(KvAccountingTest, NoPriorityPreemptionForEqualPriorityOrFcfs) {
  for (const SchedulingPolicy policy :
       {SchedulingPolicy::kPriority, SchedulingPolicy::kFcfs}) {
    SchedulerConfig c = TinyConfig();
    c.policy = policy;
    Driver d(c);
    d.Add(1, 8, 4, /*priority=*/0);
    d.Step();
    d.Add(2, 12, 2, /*priority=*/policy == SchedulingPolicy::kFcfs ? -1 : 0);
    const SchedulerOutput out = d.Step();
    EXPECT_THAT(out.preempted, IsEmpty());
    d.Run();
    EXPECT_EQ(d.priority_, 0);
    EXPECT_EQ(d.sched().stats().num_priority_preemptions_recompute_total +
                  d.sched().stats().num_priority_preemptions_swap_total,
              0);
  }
}

// A head that would not fit even with every less important request gone
// preempts nothing: the low-priority request keeps running.
TEST(KvAccountingTest, NoPriorityPreemptionThatCannotHelp) {
  SchedulerConfig c = TinyConfig();
  c.num_blocks = 6;
  c.policy = SchedulingPolicy::kPriority;
  Driver d(c);
  d.Add(1, 12, 4, /*priority=*/0);  // 3 blocks, then a 4th; as important
  d.Add(2, 4, 4, /*priority=*/9);   // 1 block, then a 2nd
  d.Step();
  d.Add(3, 16, 2, /*priority=*/0);  // 4 blocks: 6 - 3 without request 2
  d.Run();
  EXPECT_EQ(d.sched().stats().num_preemptions_total, 0);
  EXPECT_EQ(d.finished_.size(), 3u);
}

// A victim whose copy-on-write copy was voided by its preemption must not
// index that copy (it holds nothing) as a cached tail.
TEST(KvAccountingTest, VoidedCopyOnWriteBlockIsNoCachedTail) {
  SchedulerConfig c = TinyConfig();
  c.policy = SchedulingPolicy::kPriority;
  c.enable_prefix_caching = true;
  Driver d(c);
  d.Add(1, 6, 8, /*priority=*/5);  // a full block and 2 tokens of another
  d.Step();                        // prompt computed, first token sampled
  const Request* parent = d.sched().GetRequest(1);
  std::vector<int32_t> prompt = parent->prompt_token_ids();
  auto child = std::make_unique<Request>(2, prompt, 8, /*priority=*/5);
  child->set_output_token_ids({99});
  ASSERT_TRUE(d.sched().Fork(1, std::move(child)).ok());
  // Next step: the parent copies the shared partial block (COW), the child
  // writes the original; the urgent head needs 3 of the 4 blocks, so both
  // are preempted and the parent's copy never runs.
  d.Add(3, 9, 2, /*priority=*/0);
  const SchedulerOutput out = d.sched().Schedule();
  ASSERT_EQ(out.preempted.size(), 2u);
  ASSERT_EQ(out.blocks_to_copy.size(), 0u);  // voided with its owner
  const kvcache::PrefixMatch m = d.sched().kv_cache().FindCachedPrefix(
      {prompt, std::vector<int32_t>{7}}, kvcache::NamespaceHash("", ""));
  EXPECT_EQ(m.blocks.size(), 1u);
  // Blocks 0 and 1 hold the prompt; block 2 (the free queue's head) was the
  // parent's copy-on-write target. The tail is the child's block 1, whose
  // two tokens were written, never the void copy.
  EXPECT_EQ(m.tail_block, 1);
  EXPECT_EQ(m.tail_tokens, 2);
  ASSERT_TRUE(d.sched().CheckInvariants().ok());
}

}  // namespace
}  // namespace kvserve::scheduler
