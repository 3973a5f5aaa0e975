// Elapsed-time helpers for logs and measured cost models, and the clock the
// engine stamps requests and steps with: the system's, or a simulation's
// virtual one that only moves when the simulation moves it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvserve {

// Seconds from `t` to now, on the clock `t` came from.
inline double SecondsSince(absl::Time t) {
  return absl::ToDoubleSeconds(absl::Now() - t);
}
inline double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

// Seconds from `a` to `b`.
inline double SecondsBetween(absl::Time a, absl::Time b) {
  return absl::ToDoubleSeconds(b - a);
}
inline double SecondsBetween(std::chrono::steady_clock::time_point a,
                             std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class Clock {
 public:
  virtual ~Clock() = default;
  [[nodiscard]] virtual absl::Time Now() const = 0;
};

// absl::Now().
class SystemClock final : public Clock {
 public:
  [[nodiscard]] absl::Time Now() const override { return absl::Now(); }
  // The one instance.
  [[nodiscard]] static const SystemClock& Get() {
    static const SystemClock clock;
    return clock;
  }
};

// Time that passes only through AdvanceTo: a trace replay moves it by each
// simulated step and jumps it over idle gaps. Never goes backwards.
// Thread-safe.
class VirtualClock final : public Clock {
 public:
  explicit VirtualClock(absl::Time start = absl::UnixEpoch())
      : ns_(absl::ToUnixNanos(start)) {}
  [[nodiscard]] absl::Time Now() const override {
    return absl::FromUnixNanos(ns_.load(std::memory_order_acquire));
  }
  // Moves the clock to `t` if that is later than now.
  void AdvanceTo(absl::Time t) {
    const int64_t want = absl::ToUnixNanos(t);
    int64_t cur = ns_.load(std::memory_order_relaxed);
    while (want > cur &&
           !ns_.compare_exchange_weak(cur, want, std::memory_order_acq_rel)) {
    }
  }

 private:
  std::atomic<int64_t> ns_;
};

}  // namespace kvserve
