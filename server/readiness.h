// Readiness that reflects progress. A StallDetector judges, from successive
// engine stats snapshots, whether the engine is stalled: it has work
// (running or waiting requests) yet no step has completed for the stall
// timeout. A StallWatchdog polls the engine on its own thread and reports
// each change of that judgement (with a log line saying why); the daemon
// owns what readiness drives (/ready and gRPC health).
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/engine.h"

namespace kvserve::server {

// Not thread-safe; fed by one thread. Invariant: `last_progress_` is the
// latest observation at which a step had completed since the previous one,
// or the engine had no work.
class StallDetector {
 public:
  explicit StallDetector(absl::Duration timeout) : timeout_(timeout) {}

  // Feeds one snapshot taken at `now`; returns whether stalled.
  bool Observe(const engine::EngineStats& stats, absl::Time now);
  // Why the last Observe said stalled (for the log line).
  std::string Reason() const { return reason_; }

 private:
  absl::Duration timeout_;
  int64_t last_steps_ = -1;
  absl::Time last_progress_ = absl::InfinitePast();
  std::string reason_;
};

class StallWatchdog {
 public:
  // Polls `stats` every min(timeout / 4, 1 s); calls `on_change(serving)`
  // from its thread whenever the judgement flips (serving = not stalled).
  StallWatchdog(std::function<engine::EngineStats()> stats,
                absl::Duration timeout,
                std::function<void(bool serving)> on_change);
  ~StallWatchdog();  // stops and joins the thread; no callback after it

  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

 private:
  void Run();

  std::function<engine::EngineStats()> stats_;
  absl::Duration timeout_;
  std::function<void(bool)> on_change_;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace kvserve::server
