// ReservationStrategy: how much KV a running request holds, one strategy per
// KvReservation (SchedulerConfig::kv_reservation). The scheduler asks it
// wherever paging and contiguous max-length slabs differ: what admission
// allocates, what a running request holds, whether cached prefixes are
// shared, whether a request's blocks may leave for KV (swap) and what a fork
// child allocates. Stateless; one per Scheduler.
#pragma once

#include <cstdint>
#include <memory>

#include "scheduler/scheduler_config.h"

namespace kvserve::scheduler {

class ReservationStrategy {
 public:
  virtual ~ReservationStrategy() = default;

  // Tokens the table of a request admitted from `start` (matched prefix or
  // swapped computed tokens) with `n` new tokens must cover.
  [[nodiscard]] virtual int64_t AdmissionTokens(int32_t start,
                                                int32_t n) const = 0;
  // Blocks a running request with `computed` tokens holds.
  [[nodiscard]] virtual int64_t HeldBlocks(int32_t computed) const = 0;
  // Blocks one request of prompt + max_tokens = `total` needs at most.
  [[nodiscard]] virtual int64_t MostBlocks(int64_t total) const = 0;
  // Whether requests share cached prefix blocks (lookup, tails, ranking).
  [[nodiscard]] virtual bool SharesPrefixes() const = 0;
  // Whether a running request grows, and so may be preempted for KV (a
  // slab never is: it holds all it will need from admission).
  [[nodiscard]] virtual bool Grows() const = 0;
  // Tokens a fork child allocates beyond the blocks it shares with its
  // parent (0: it allocates as it grows).
  [[nodiscard]] virtual int64_t ForkTokens() const = 0;
};

// The strategy of `config.kv_reservation`, sized by `config`.
[[nodiscard]] std::unique_ptr<const ReservationStrategy> MakeReservation(
    const SchedulerConfig& config);

}  // namespace kvserve::scheduler
