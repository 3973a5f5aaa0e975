#include "server/readiness.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace kvserve::server {

bool StallDetector::Observe(const engine::EngineStats& stats, absl::Time now) {
  const bool has_work = stats.running > 0 || stats.waiting > 0;
  if (!has_work || stats.steps != last_steps_) last_progress_ = now;
  last_steps_ = stats.steps;
  const absl::Duration idle = now - last_progress_;
  if (!has_work || idle < timeout_) return false;
  reason_ = absl::StrFormat(
      "%d running and %d waiting requests, and no engine step completed for "
      "%.1f s (--stall-timeout %s)",
      stats.running, stats.waiting, absl::ToDoubleSeconds(idle),
      absl::FormatDuration(timeout_));
  return true;
}

StallWatchdog::StallWatchdog(std::function<engine::EngineStats()> stats,
                             absl::Duration timeout,
                             std::function<void(bool serving)> on_change)
    : stats_(std::move(stats)),
      timeout_(timeout),
      on_change_(std::move(on_change)) {
  thread_ = std::thread([this] { Run(); });
}

StallWatchdog::~StallWatchdog() {
  stop_.Notify();
  thread_.join();
}

void StallWatchdog::Run() {
  const absl::Duration period =
      std::clamp(timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  StallDetector detector(timeout_);
  bool stalled = false;
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    const bool now_stalled = detector.Observe(stats_(), absl::Now());
    if (now_stalled == stalled) continue;
    stalled = now_stalled;
    if (stalled) {
      spdlog::error("not ready (health NOT_SERVING): engine stalled: {}",
                    detector.Reason());
    } else {
      spdlog::warn("ready again: the engine is making progress");
    }
    on_change_(!stalled);
  }
}

}  // namespace kvserve::server
