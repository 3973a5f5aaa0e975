#include "engine/stream_state.h"

#include "gtest/gtest.h"

namespace kvserve::engine {
namespace {

TEST(StreamStateTest, OneWriteInFlightAndDeltasCoalesce) {
  StreamState s(1);
  std::vector<StreamDelta> written;
  s.Attach([&](StreamDelta d) { written.push_back(std::move(d)); });
  s.Push({1}, "a", {});
  ASSERT_EQ(written.size(), 1u);  // delivered at once: nothing in flight
  s.Push({2}, "b", {});
  s.Push({3}, "c", {});
  EXPECT_EQ(written.size(), 1u);  // held while the first write is in flight
  s.Ack();
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[1].token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(written[1].text, "bc");
  s.Finish(FinishReason::kLength,
           Usage{.prompt_tokens = 3,
                 .completion_tokens = 3,
                 .cached_prompt_tokens = 0},
           Timings{});
  EXPECT_EQ(written.size(), 2u);
  EXPECT_FALSE(s.Done());
  s.Ack();
  ASSERT_EQ(written.size(), 3u);
  EXPECT_TRUE(written[2].finished);
  EXPECT_EQ(written[2].finish_reason, FinishReason::kLength);
  EXPECT_TRUE(s.Done());
  s.Push({4}, "late", {});  // after finish: dropped
  s.Ack();
  EXPECT_EQ(written.size(), 3u);
}

TEST(StreamStateTest, OutputBeforeAttachIsKept) {
  StreamState s(2);
  s.Push({7}, "x", {});
  s.Finish(FinishReason::kStop, Usage{}, Timings{});
  std::vector<StreamDelta> written;
  s.Attach([&](StreamDelta d) { written.push_back(std::move(d)); });
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0].text, "x");
  EXPECT_TRUE(written[0].finished);
}

TEST(StreamStateTest, CompletionsInterleaveAndTheLastDeltaEndsTheStream) {
  StreamState s(3, /*n=*/2);
  std::vector<StreamDelta> written;
  s.Attach([&](StreamDelta d) { written.push_back(std::move(d)); });
  s.Push(0, {1}, "a", {});  // delivered at once
  s.Push(1, {2}, "b", {});
  s.Push(0, {3}, "c", {});
  s.Finish(0, FinishReason::kLength,
           Usage{.prompt_tokens = 5,
                 .completion_tokens = 2,
                 .cached_prompt_tokens = 4},
           Timings{});
  ASSERT_EQ(written.size(), 1u);
  s.Ack();  // round-robin: index 1 next
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(written[1].index, 1);
  EXPECT_EQ(written[1].text, "b");
  s.Ack();
  ASSERT_EQ(written.size(), 3u);
  EXPECT_EQ(written[2].index, 0);
  EXPECT_EQ(written[2].text, "c");
  EXPECT_TRUE(written[2].index_finished);
  EXPECT_FALSE(written[2].finished);  // completion 1 still runs
  EXPECT_FALSE(s.Done());
  s.Push(0, {9}, "late", {});  // after its finish: dropped
  s.Finish(1, FinishReason::kStop,
           Usage{.prompt_tokens = 5,
                 .completion_tokens = 1,
                 .cached_prompt_tokens = 4},
           Timings{});
  s.Ack();
  ASSERT_EQ(written.size(), 4u);
  EXPECT_EQ(written[3].index, 1);
  EXPECT_TRUE(written[3].finished);
  EXPECT_EQ(written[3].finish_reason, FinishReason::kStop);
  // The prompt counted once, completions summed.
  EXPECT_EQ(written[3].usage.prompt_tokens, 5);
  EXPECT_EQ(written[3].usage.cached_prompt_tokens, 4);
  EXPECT_EQ(written[3].usage.completion_tokens, 3);
  EXPECT_TRUE(s.Done());
}

}  // namespace
}  // namespace kvserve::engine
