// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), for counters of
// what a feature costs the engine thread: a clock that excludes time the
// thread waited or was descheduled, so the figure does not move with the
// machine's load the way wall time does.
#pragma once

#include <time.h>

#include <cstdint>

namespace kvserve {

[[nodiscard]] inline int64_t ThreadCpuNanos() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

// Adds the thread CPU time of its scope to `*sink` (owned by the caller and
// touched by this thread only).
class ScopedThreadCpu {
 public:
  explicit ScopedThreadCpu(int64_t* sink)
      : sink_(sink), start_(ThreadCpuNanos()) {}
  ~ScopedThreadCpu() { *sink_ += ThreadCpuNanos() - start_; }
  ScopedThreadCpu(const ScopedThreadCpu&) = delete;
  ScopedThreadCpu& operator=(const ScopedThreadCpu&) = delete;

 private:
  int64_t* sink_;
  int64_t start_;
};

}  // namespace kvserve
