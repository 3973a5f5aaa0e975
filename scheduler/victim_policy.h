// VictimPolicy: which running request a preemption takes, one per
// SchedulingPolicy (SchedulerConfig::policy). The scheduler asks it in the
// two places a request is preempted: when KV runs out for a running request
// (ForKv) and, where the policy preempts for a waiting request of better
// priority, which running request makes room for it (ForWaiting). The
// scheduler keeps the mechanics (what a preemption frees, recompute or swap,
// whether preempting helps at all). Stateless; one per Scheduler.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "scheduler/request.h"
#include "scheduler/scheduler_config.h"

namespace kvserve::scheduler {

class VictimPolicy {
 public:
  virtual ~VictimPolicy() = default;

  // `running` (admission order, non-empty) is out of KV for one of its
  // requests: the index of the request to preempt (possibly that one).
  [[nodiscard]] virtual size_t ForKv(
      absl::Span<Request* const> running) const = 0;
  // Whether running requests are preempted for a waiting one that does not
  // fit (Scheduler::PreemptForPriority).
  [[nodiscard]] virtual bool PreemptsForWaiting() const = 0;
  // The index of the request to preempt for a waiting one among those
  // `eligible` accepts, or running.size() when none. `rank`: a request's
  // aged priority (lower runs first).
  [[nodiscard]] virtual size_t ForWaiting(
      absl::Span<Request* const> running,
      absl::FunctionRef<bool(const Request&)> eligible,
      absl::FunctionRef<double(const Request&)> rank) const = 0;
};

// The victim policy of `policy`.
[[nodiscard]] std::unique_ptr<const VictimPolicy> MakeVictimPolicy(
    SchedulingPolicy policy);

}  // namespace kvserve::scheduler
