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
  EXPECT_GE(c.Draft(8, 0.1), 1);
  for (int i = 0; i < 3; ++i) c.Observe(4, 0);  // rejected three times
  int skipped = 0;
  while (c.Draft(8, 0.1) == 0) ++skipped;
  EXPECT_GE(skipped, 1);
  // Accepted drafts grow the proposal up to the limit.
  for (int i = 0; i < 10; ++i) c.Observe(4, 4);
  EXPECT_EQ(c.Draft(8, 0.1), 8);
  EXPECT_EQ(c.Draft(3, 0.1), 3);
}

// Draft length trades the expected accepted run against what each draft
// token costs: free drafts go to the limit, costly ones stop early.
TEST(SpeculationControlTest, DraftLengthFollowsTheCost) {
  SpeculationControl c;
  for (int i = 0; i < 20; ++i) c.Observe(10, 9);  // rate 0.9
  EXPECT_EQ(c.Draft(16, 0.0), 16);
  const int32_t cheap = c.Draft(16, 0.1);
  const int32_t costly = c.Draft(16, 0.5);
  EXPECT_GT(cheap, costly);
  EXPECT_GE(costly, 2);
  EXPECT_LE(costly, 4);
  // (1 + .9 + .81 + .73) / (1 + 3 * .5) = 1.38 beats k = 2 (1.36) and
  // k = 4 (1.37).
  EXPECT_EQ(costly, 3);
}

TEST(SpeculationCostTest, MeasuresVerificationAndDraftingPerToken) {
  SpeculationCost cost;
  for (int i = 0; i < 50; ++i) {
    cost.ObserveStep(0.010, 1, 0);  // a plain decode step: 10 ms
    cost.ObserveStep(0.014, 1, 4);  // four drafts verified: 1 ms each
  }
  EXPECT_NEAR(cost.PerDraftToken(), 0.1, 0.01);
  for (int i = 0; i < 50; ++i) cost.ObserveDraft(0.012, 4);  // 3 ms a token
  EXPECT_NEAR(cost.PerDraftToken(), 0.1 + 0.3, 0.02);
  // Prompt steps are not observed by the engine; a step of two sequences
  // counts per sequence.
  for (int i = 0; i < 50; ++i) cost.ObserveStep(0.028, 2, 8);
  EXPECT_NEAR(cost.PerDraftToken(), 0.4, 0.02);
}

}  // namespace
}  // namespace kvserve::engine
