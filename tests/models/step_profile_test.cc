// The measured step-time model (models/sim/step_profile.h): least squares
// recovers the coefficients that generated the steps, refuses steps that do
// not determine them, and never predicts a negative time.
#include "models/sim/step_profile.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::models::sim {
namespace {

using ::testing::HasSubstr;

constexpr StepProfile kTruth{4e-3, 5e-4, 2e-5, 8e-7, 6e-7, 3e-3};

std::vector<StepSample> Steps() {
  std::vector<StepSample> out;
  // Decode steps of 1..32 sequences at contexts 100..2000, and prefill
  // chunks of 16..512 tokens with a few decodes riding along.
  for (int64_t seqs = 1; seqs <= 32; seqs *= 2) {
    for (int64_t ctx = 100; ctx <= 2000; ctx += 380) {
      StepLoad l{seqs, seqs * ctx, seqs * (ctx - 1), seqs};
      out.push_back({l, kTruth.Seconds(l)});
    }
  }
  for (int64_t n = 16; n <= 512; n *= 2) {
    for (int64_t riders = 0; riders <= 4; riders += 2) {
      StepLoad l{n + riders, n * (n + 1) / 2 + riders * 300, riders * 299,
                 1 + riders};
      out.push_back({l, kTruth.Seconds(l)});
    }
  }
  return out;
}

TEST(StepProfileTest, RecoversTheCoefficientsThatMadeTheSteps) {
  absl::StatusOr<StepProfile> p = FitStepProfile(Steps());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->base_s, kTruth.base_s, 1e-9);
  EXPECT_NEAR(p->per_token_s, kTruth.per_token_s, 1e-11);
  EXPECT_NEAR(p->per_seq_s, kTruth.per_seq_s, 1e-10);
  EXPECT_NEAR(p->per_attended_s, kTruth.per_attended_s, 1e-13);
  EXPECT_NEAR(p->per_kv_read_s, kTruth.per_kv_read_s, 1e-13);
  EXPECT_NEAR(p->prefill_s, kTruth.prefill_s, 1e-9);
}

TEST(StepProfileTest, RefusesStepsThatDoNotDetermineIt) {
  const std::vector<StepSample> all = Steps();
  std::vector<StepSample> few(all.begin(), all.begin() + 5);
  absl::StatusOr<StepProfile> p = FitStepProfile(few);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("at least 6"));
  // Every step the same decode shape: nothing separates the terms.
  std::vector<StepSample> same(50, {{8, 8000, 7992, 8}, 0.01});
  p = FitStepProfile(same);
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("do not determine"));
}

TEST(StepProfileTest, NeverPredictsBelowHalfTheBase) {
  const StepProfile p{4e-3, 1e-4, -5e-3, 0, 0, 0};
  EXPECT_DOUBLE_EQ(p.Seconds({10, 0, 0, 10}), 2e-3);
  EXPECT_DOUBLE_EQ(p.Seconds({1, 0, 0, 0}), 4.1e-3);
}

}  // namespace
}  // namespace kvserve::models::sim
