// The VictimPolicy implementations: latest admitted first (FCFS), worst
// priority first (priority and cache-aware).
#include "scheduler/victim_policy.h"

#include <utility>

#include "common/check.h"

namespace kvserve::scheduler {
namespace {

// FCFS: the latest admitted request goes first, so that the earliest
// arrivals keep running; nothing is preempted for a waiting request.
class LatestAdmittedVictim final : public VictimPolicy {
 public:
  size_t ForKv(absl::Span<Request* const> running) const override {
    KV_CHECK(!running.empty());
    return running.size() - 1;
  }
  bool PreemptsForWaiting() const override { return false; }
  size_t ForWaiting(
      absl::Span<Request* const> running,
      absl::FunctionRef<bool(const Request&)> /*eligible*/,
      absl::FunctionRef<double(const Request&)> /*rank*/) const override {
    return running.size();
  }
};

// The request of the largest priority value goes first, the latest admitted
// among equals. `preempts_for_waiting`: the priority policy also preempts
// for a waiting request of better aged priority; cache-aware only orders.
class WorstPriorityVictim final : public VictimPolicy {
 public:
  explicit WorstPriorityVictim(bool preempts_for_waiting)
      : preempts_for_waiting_(preempts_for_waiting) {}

  size_t ForKv(absl::Span<Request* const> running) const override {
    KV_CHECK(!running.empty());
    size_t best = 0;
    for (size_t i = 1; i < running.size(); ++i) {
      const Request& a = *running[i];
      const Request& b = *running[best];
      if (std::pair(a.priority(), a.admit_seq()) >
          std::pair(b.priority(), b.admit_seq())) {
        best = i;
      }
    }
    return best;
  }
  bool PreemptsForWaiting() const override { return preempts_for_waiting_; }
  size_t ForWaiting(
      absl::Span<Request* const> running,
      absl::FunctionRef<bool(const Request&)> eligible,
      absl::FunctionRef<double(const Request&)> rank) const override {
    size_t best = running.size();
    for (size_t i = 0; i < running.size(); ++i) {
      const Request& a = *running[i];
      if (!eligible(a)) continue;
      if (best == running.size() ||
          std::pair(rank(a), a.admit_seq()) >
              std::pair(rank(*running[best]), running[best]->admit_seq())) {
        best = i;
      }
    }
    return best;
  }

 private:
  bool preempts_for_waiting_;
};

}  // namespace

std::unique_ptr<const VictimPolicy> MakeVictimPolicy(SchedulingPolicy policy) {
  switch (policy) {
    case SchedulingPolicy::kPriority:
      return std::make_unique<WorstPriorityVictim>(true);
    case SchedulingPolicy::kCacheAware:
      return std::make_unique<WorstPriorityVictim>(false);
    case SchedulingPolicy::kFcfs:
      break;
  }
  return std::make_unique<LatestAdmittedVictim>();
}

}  // namespace kvserve::scheduler
