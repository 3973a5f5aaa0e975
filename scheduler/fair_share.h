// FairShare: the scheduler's per-tenant bookkeeping and the two decisions
// that read it, kept in one place so that a scheduling policy can use them
// as they are:
//   - which waiting request is admitted next (Candidate): the first in
//     queue order among tenants that may run another request, where a
//     tenant below its share of max_num_seqs goes before every tenant at or
//     above it;
//   - how a step's prefill tokens are split (SplitPrefill): by tenant
//     weight among tenants with prefill work, first come first served
//     within a tenant.
// A tenant's share is max_num_seqs x its weight / the weights of the
// tenants with live requests. Seats are sequences (Request::seats()).
//
// Owns the per-tenant waiting queues (the scheduler keeps the global one
// too, for its order and its invariants) and running-seat counts. Does not
// own requests. Thread safety: none (engine thread, like the scheduler).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "scheduler/request.h"

namespace kvserve::scheduler {

class FairShare {
 public:
  explicit FairShare(int32_t max_num_seqs) : max_num_seqs_(max_num_seqs) {}

  // A request of `policy` becomes live (AddRequest, Fork): returns its
  // tenant id. The tenant takes the policy's weight and cap.
  [[nodiscard]] int32_t Join(const TenantPolicy& policy);
  // A live request of `tenant` ends.
  void Leave(int32_t tenant);

  void AddRunningSeats(int32_t tenant, int32_t seats);
  [[nodiscard]] int32_t running_seats() const { return running_seats_; }
  // Seats the waiting requests will take (as of their Enqueue).
  [[nodiscard]] int64_t waiting_seats() const { return waiting_seats_; }
  // A waiting request's seats change by `delta` (EndForks while waiting).
  void AddWaitingSeats(int32_t delta) { waiting_seats_ += delta; }
  [[nodiscard]] int32_t running_seats(int32_t tenant) const {
    return tenants_[tenant].running_seats;
  }

  void Enqueue(Request* r);
  void Dequeue(const Request* r);

  // The request to admit next, or null when every tenant with waiting work
  // is at its cap (max_running).
  [[nodiscard]] Request* Candidate() const;
  // Whether `tenant` runs at least its share (see the header comment).
  [[nodiscard]] bool AtOrAboveShare(int32_t tenant) const;
  // Whether `tenant` may add `seats` running sequences under its cap.
  [[nodiscard]] bool UnderCap(int32_t tenant, int32_t seats) const;
  // `tenant`'s waiting requests in queue order.
  [[nodiscard]] const std::map<Request::QueueKey, Request*>& Waiting(
      int32_t tenant) const {
    return tenants_[tenant].waiting;
  }

  // Splits `budget` prefill tokens among requests that want want[i] (>= 0)
  // and belong to tenant[i], listed in admission order: tenants get shares
  // by weight, no more than they want (what one leaves goes to the others),
  // and within a tenant earlier requests are served first. Returns each
  // request's tokens; they sum to min(budget, total wanted).
  [[nodiscard]] std::vector<int32_t> SplitPrefill(
      const std::vector<int32_t>& tenant, const std::vector<int32_t>& want,
      int32_t budget) const;

 private:
  struct Tenant {
    std::string name;
    int32_t weight = 1;
    int32_t max_running = 0;
    int32_t live = 0;
    int32_t running_seats = 0;
    std::map<Request::QueueKey, Request*> waiting;
  };

  // Sum of the weights of tenants with live requests.
  [[nodiscard]] int64_t ActiveWeight() const;

  int32_t max_num_seqs_;
  int32_t running_seats_ = 0;
  int64_t waiting_seats_ = 0;
  std::vector<Tenant> tenants_;
  absl::flat_hash_map<std::string, int32_t> ids_;
};

// Integer water-filling: splits `budget` among demands by weight, each
// getting at most its demand; what capped ones leave is split among the
// rest. Remainders of the division go one by one in index order. Returns
// amounts summing to min(budget, sum of demands).
[[nodiscard]] std::vector<int64_t> WaterFill(const std::vector<int64_t>& demand,
                                             const std::vector<int64_t>& weight,
                                             int64_t budget);

}  // namespace kvserve::scheduler
