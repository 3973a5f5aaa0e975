// StallDetector: readiness follows engine progress (see server/readiness.h).
#include "gtest/gtest.h"
#include "server/readiness.h"

namespace kvserve::server {
namespace {

engine::EngineStats Stats(int running, int waiting, int64_t steps) {
  engine::EngineStats s;
  s.running = running;
  s.waiting = waiting;
  s.steps = steps;
  return s;
}

TEST(StallDetectorTest, IdleEngineIsNeverStalled) {
  StallDetector d(absl::Seconds(1));
  const absl::Time t0 = absl::UnixEpoch();
  EXPECT_FALSE(d.Observe(Stats(0, 0, 5), t0));
  EXPECT_FALSE(d.Observe(Stats(0, 0, 5), t0 + absl::Hours(1)));
}

TEST(StallDetectorTest, WorkWithoutStepsStallsAfterTheTimeout) {
  StallDetector d(absl::Seconds(1));
  const absl::Time t0 = absl::UnixEpoch();
  EXPECT_FALSE(d.Observe(Stats(0, 0, 5), t0));
  EXPECT_FALSE(d.Observe(Stats(1, 2, 5), t0 + absl::Milliseconds(500)));
  EXPECT_FALSE(d.Observe(Stats(1, 2, 5), t0 + absl::Milliseconds(999)));
  EXPECT_TRUE(d.Observe(Stats(1, 2, 5), t0 + absl::Seconds(1)));
  EXPECT_NE(d.Reason().find("1 running and 2 waiting"), std::string::npos)
      << d.Reason();
  EXPECT_NE(d.Reason().find("--stall-timeout"), std::string::npos);
}

TEST(StallDetectorTest, ProgressOrNoWorkClearsTheStall) {
  StallDetector d(absl::Seconds(1));
  const absl::Time t0 = absl::UnixEpoch();
  EXPECT_FALSE(d.Observe(Stats(0, 1, 5), t0));
  EXPECT_TRUE(d.Observe(Stats(0, 1, 5), t0 + absl::Seconds(2)));
  // A step completed: ready again, and the clock restarts.
  EXPECT_FALSE(d.Observe(Stats(1, 0, 6), t0 + absl::Seconds(3)));
  EXPECT_FALSE(d.Observe(Stats(1, 0, 6), t0 + absl::Milliseconds(3500)));
  EXPECT_TRUE(d.Observe(Stats(1, 0, 6), t0 + absl::Seconds(4)));
  // The work went away (e.g. cancelled): ready.
  EXPECT_FALSE(d.Observe(Stats(0, 0, 6), t0 + absl::Seconds(5)));
}

TEST(StallDetectorTest, SteadyStepsAreNotAStall) {
  StallDetector d(absl::Seconds(1));
  const absl::Time t0 = absl::UnixEpoch();
  for (int i = 0; i < 100; ++i) {
    EXPECT_FALSE(d.Observe(Stats(4, 10, i), t0 + absl::Milliseconds(500 * i)));
  }
}

}  // namespace
}  // namespace kvserve::server
