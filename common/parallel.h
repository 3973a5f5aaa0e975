// CPU parallelism for compute kernels: a thin layer over OpenMP (when
// enabled) so kernels state *what* splits, not how threads are managed.
// Thread count defaults to the number of online CPUs; KVSERVE_THREADS or
// SetNumThreads() override it. Not reentrant: call from one thread at a time
// (the engine thread owns all forward passes).
#pragma once

#include <algorithm>
#include <cstdint>

#ifdef KVSERVE_HAVE_OPENMP
#include <omp.h>
#endif

namespace kvserve {

// Number of worker threads kernels use (>= 1).
int NumThreads();
void SetNumThreads(int n);

// Calls fn(begin, end) over disjoint chunks covering [0, n), one chunk per
// thread, with chunk boundaries on multiples of `grain`. Runs inline when n
// is small or only one thread is configured.
template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<int64_t>(NumThreads(), units));
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
#ifdef KVSERVE_HAVE_OPENMP
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int64_t lo = units * t / threads * grain;
    const int64_t hi = std::min(n, units * (t + 1) / threads * grain);
    if (lo < hi) fn(lo, hi);
  }
#else
  fn(int64_t{0}, n);
#endif
}

// Calls fn(i) for every i in [0, n), handing items to threads dynamically:
// for items of uneven cost (e.g. attention rows of causal prefill).
template <typename Fn>
void ParallelForEach(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#ifdef KVSERVE_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i);
#else
  for (int64_t i = 0; i < n; ++i) fn(i);
#endif
}

}  // namespace kvserve
