// Elapsed-time helpers for logs and measured cost models.
#pragma once

#include <chrono>

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

}  // namespace kvserve
