// The prompt-lookup proposer and the per-request speculation controller
// (engine/speculation.h).
#include <vector>

#include "engine/speculation.h"
#include "gtest/gtest.h"

namespace kvserve::engine {
namespace {

std::vector<int32_t> Draft(const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& output, int32_t k) {
  return NgramDraft({prompt, output}, 4, 2, k);
}

TEST(NgramDraftTest, CopiesWhatFollowedTheLatestLongestMatch) {
  // The suffix (3, 4) occurred at 2..3 and 7..8: the latest one wins.
  EXPECT_EQ(Draft({1, 2, 3, 4, 5, 6, 3, 4, 9, 8}, {3, 4}, 3),
            (std::vector<int32_t>{9, 8, 3}));
  // A longer match beats a later shorter one: (7, 3, 4) at 1..3.
  EXPECT_EQ(Draft({0, 7, 3, 4, 5, 9, 3, 4, 6}, {7, 3, 4}, 2),
            (std::vector<int32_t>{5, 9}));
  // Across the prompt and the output, cut at k and at the end.
  EXPECT_EQ(Draft({5, 6}, {7, 5, 6}, 8), (std::vector<int32_t>{7, 5, 6}));
}

TEST(NgramDraftTest, NothingWithoutAMatchOfTheShortestLength) {
  EXPECT_TRUE(Draft({1, 2, 3, 4}, {5}, 4).empty());
  EXPECT_TRUE(Draft({1, 2, 1}, {}, 4).empty());  // one token is too short
  EXPECT_TRUE(Draft({1, 2, 1, 2}, {}, 0).empty());
}

TEST(SpeculationControlTest, BacksOffWhenDraftsAreRejected) {
  SpeculationControl c;
  EXPECT_GE(c.Draft(8), 1);
  for (int i = 0; i < 3; ++i) c.Observe(4, 0);  // rejected three times
  int skipped = 0;
  while (c.Draft(8) == 0) ++skipped;
  EXPECT_GE(skipped, 1);
  // Accepted drafts grow the proposal up to the limit.
  for (int i = 0; i < 10; ++i) c.Observe(4, 4);
  EXPECT_EQ(c.Draft(8), 8);
  EXPECT_EQ(c.Draft(3), 3);
}

}  // namespace
}  // namespace kvserve::engine
