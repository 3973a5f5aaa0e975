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
  s.Finish(FinishReason::kLength, Usage{3, 3, 0}, Timings{});
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

}  // namespace
}  // namespace kvserve::engine
