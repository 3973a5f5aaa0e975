// Speculative decoding in the scheduler (Scheduler::SetDraft): a decode
// step writes its last token and the draft, and UpdateFromOutput keeps the
// KV of the accepted drafts only, freeing blocks allocated past them, so
// the KV accounting, the prefix cache and max_tokens hold as without one.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {
namespace {

SchedulerConfig Config() {
  SchedulerConfig c;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 64;
  c.block_size = 4;
  c.num_blocks = 16;
  c.watermark = 0.0;
  c.max_model_len = 64;
  c.enable_prefix_caching = true;
  return c;
}

std::unique_ptr<Request> Make(RequestId id, int32_t prompt_len,
                              int32_t max_tokens) {
  std::vector<int32_t> prompt(prompt_len);
  for (int32_t i = 0; i < prompt_len; ++i) prompt[i] = 1000 * id + i;
  return std::make_unique<Request>(id, std::move(prompt), max_tokens);
}

class SpeculationTest : public ::testing::Test {
 protected:
  // Schedules a step and answers it with `tokens` sampled per producer.
  SchedulerOutput Step(const std::vector<std::vector<int32_t>>& tokens) {
    SchedulerOutput out = sched_.Schedule();
    std::vector<int32_t> flat, counts;
    for (const auto& t : tokens) {
      flat.insert(flat.end(), t.begin(), t.end());
      counts.push_back(static_cast<int32_t>(t.size()));
    }
    finished_ = sched_.UpdateFromOutput(out, flat, counts);
    const absl::Status s = sched_.CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  Scheduler sched_{Config()};
  std::vector<FinishedRequest> finished_;
};

TEST_F(SpeculationTest, RejectedDraftsGiveTheirBlocksBack) {
  ASSERT_TRUE(sched_.AddRequest(Make(1, 6, 20)).ok());
  Step({{7}});  // prefill of 6 tokens, first output token 7
  const int32_t free_before = sched_.stats().kv.free_blocks;
  // Positions 6..11: the last token and a 5-token draft (3 blocks).
  sched_.SetDraft(1, {8, 9, 10, 11, 12});
  SchedulerOutput out = Step({{99}});  // the first draft token is rejected
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 6);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 5);
  EXPECT_EQ(std::vector<int32_t>(out.token_ids.begin(), out.token_ids.end()),
            (std::vector<int32_t>{7, 8, 9, 10, 11, 12}));
  const Request* r = sched_.GetRequest(1);
  EXPECT_EQ(r->output_token_ids(), (std::vector<int32_t>{7, 99}));
  // KV of the prompt and token 7 only: 7 tokens in 2 blocks, as without.
  EXPECT_EQ(r->num_computed_tokens(), 7);
  EXPECT_EQ(sched_.stats().kv.free_blocks, free_before);

  // Accepted drafts: three of four, then the bonus token.
  sched_.SetDraft(1, {20, 21, 22, 23});
  out = Step({{20, 21, 22, 77}});
  EXPECT_EQ(out.scheduled[0].start_position, 7);
  EXPECT_EQ(r->output_token_ids(),
            (std::vector<int32_t>{7, 99, 20, 21, 22, 77}));
  EXPECT_EQ(r->num_computed_tokens(), 11);  // 99, 20, 21, 22 written
  EXPECT_EQ(r->num_tokens(), 12);
  out = Step({{5}});  // a plain decode at the rolled-back position
  EXPECT_EQ(out.scheduled[0].start_position, 11);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 0);
}

TEST_F(SpeculationTest, DraftsStopAtMaxTokensAndTheStepBudget) {
  ASSERT_TRUE(sched_.AddRequest(Make(1, 6, 3)).ok());
  Step({{7}});
  sched_.SetDraft(1, {8, 9, 10, 11});
  SchedulerOutput out = Step({{8, 9}});  // at most 3 - 1 - 1 drafts
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 1);
  ASSERT_EQ(finished_.size(), 1u);  // max_tokens reached
  EXPECT_EQ(finished_[0].reason, FinishReason::kLength);

  SchedulerConfig small = Config();
  small.max_num_batched_tokens = 3;
  Scheduler sched(small);
  ASSERT_TRUE(sched.AddRequest(Make(2, 3, 20)).ok());
  SchedulerOutput first = sched.Schedule();
  (void)sched.UpdateFromOutput(first, std::vector<int32_t>{5});
  sched.SetDraft(2, {6, 7, 8, 9});
  const SchedulerOutput second = sched.Schedule();
  EXPECT_EQ(second.scheduled[0].num_draft_tokens, 2);  // the step's budget
  (void)sched.UpdateFromOutput(second, std::vector<int32_t>{6, 7, 1},
                               std::vector<int32_t>{3});
  EXPECT_TRUE(sched.CheckInvariants().ok());
}

TEST_F(SpeculationTest, OnlyVerifiedTokensEnterThePrefixCache) {
  ASSERT_TRUE(sched_.AddRequest(Make(1, 7, 20)).ok());
  Step({{7}});  // 7 prompt tokens computed, output 7 pending
  // Token 7 at position 7 ends block 1; the draft fills blocks 2 and 3.
  sched_.SetDraft(1, {8, 9, 10, 11, 12, 13});
  Step({{8, 50}});  // one draft accepted
  const Request* r = sched_.GetRequest(1);
  EXPECT_EQ(r->num_computed_tokens(), 9);
  // A request whose prompt is the rejected path finds the two blocks of
  // verified tokens only (8 tokens), not the draft's.
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 7; ++i) prompt.push_back(1000 + i);
  for (int32_t t : {7, 8, 9, 10, 11, 12, 13}) prompt.push_back(t);
  auto other = std::make_unique<Request>(2, prompt, 4);
  ASSERT_TRUE(sched_.AddRequest(std::move(other)).ok());
  Step({{1}, {2}});
  EXPECT_EQ(sched_.GetRequest(2)->num_cached_tokens(), 8);
}

TEST_F(SpeculationTest, BlocksFilledByAcceptedDraftsAreCachedAtOnce) {
  ASSERT_TRUE(sched_.AddRequest(Make(1, 6, 7)).ok());
  Step({{7}});
  // Positions 6..11 verified and a bonus token: 12 computed tokens, three
  // full blocks, and max_tokens (7) reached in the same step.
  sched_.SetDraft(1, {8, 9, 10, 11, 12});
  Step({{8, 9, 10, 11, 12, 13}});
  ASSERT_EQ(finished_.size(), 1u);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 6; ++i) prompt.push_back(1000 + i);
  for (int32_t t : {7, 8, 9, 10, 11, 12, 0}) prompt.push_back(t);
  ASSERT_TRUE(sched_.AddRequest(std::make_unique<Request>(2, prompt, 2)).ok());
  Step({{1}});
  EXPECT_EQ(sched_.GetRequest(2)->num_cached_tokens(), 12);
}

TEST(SpeculationPool, ADraftNeverPreemptsOrTakesTheLastBlocks) {
  SchedulerConfig c = Config();
  c.num_blocks = 4;
  c.enable_prefix_caching = false;
  Scheduler sched(c);
  ASSERT_TRUE(sched.AddRequest(Make(1, 6, 10)).ok());
  ASSERT_TRUE(sched.AddRequest(Make(2, 7, 2)).ok());
  SchedulerOutput out = sched.Schedule();  // both prefills: the pool is full
  (void)sched.UpdateFromOutput(out, std::vector<int32_t>{7, 7});
  sched.SetDraft(1, {8, 9, 10, 11, 12});
  out = sched.Schedule();
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.scheduled.size(), 2u);
  // Request 1's last token sits at position 6 of its 8-slot blocks: one
  // draft token fits, the rest would need a block nobody has.
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 1);
  (void)sched.UpdateFromOutput(out, std::vector<int32_t>{8, 9, 3},
                               std::vector<int32_t>{2, 1});
  EXPECT_TRUE(sched.CheckInvariants().ok());
}

TEST_F(SpeculationTest, BoundedKvRequestsAndWaitingOnesTakeNoDraft) {
  auto windowed = Make(1, 6, 20);
  windowed->set_kv_window({.sinks = 4, .window = 16});
  ASSERT_TRUE(sched_.AddRequest(std::move(windowed)).ok());
  sched_.SetDraft(1, {1, 2});  // waiting: ignored
  Step({{7}});
  sched_.SetDraft(1, {8, 9});  // bounded KV: ignored
  const SchedulerOutput out = Step({{8}});
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 0);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
}

}  // namespace
}  // namespace kvserve::scheduler
