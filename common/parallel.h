// CPU parallelism for compute kernels: kernels state *what* splits, and
// ComputePool (thread_pool.h) runs the pieces. Thread count defaults to the
// number of online CPUs; KVSERVE_THREADS or SetNumThreads() override it.
//
// Work is cut into more chunks than threads and claimed dynamically, so a
// kernel's result must not depend on where chunks begin or end (every
// caller computes each output element from its own inputs alone); the
// tests compare 1 and 2 threads bit for bit. Safe from any thread: a call
// made while another thread's job runs, or from inside a chunk, runs inline.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/thread_pool.h"

namespace kvserve {

// Number of threads kernels use, the caller included (>= 1).
int NumThreads();
void SetNumThreads(int n);

namespace internal {
// Runs fn(ctx, c) for every c in [0, chunks) on the shared pool of
// NumThreads() - 1 workers. Precondition: chunks <= ComputePool::kMaxChunks.
void RunChunks(int64_t chunks, ComputePool::ChunkFn fn, void* ctx);
// Chunks per thread for ParallelFor: enough that a late thread costs a
// small share of the work, few enough that claiming stays cheap.
inline constexpr int64_t kChunksPerThread = 4;
}  // namespace internal

// Calls fn(begin, end) over disjoint chunks covering [0, n), chunk
// boundaries on multiples of `grain`. Runs inline when n is one grain or
// only one thread is configured.
template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t threads = std::min<int64_t>(NumThreads(), units);
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  struct Split {
    std::remove_reference_t<Fn>* fn;
    int64_t n, grain, units, chunks;
  } split{&fn, n, grain, units,
          std::min({units, threads * internal::kChunksPerThread,
                    ComputePool::kMaxChunks})};
  internal::RunChunks(
      split.chunks,
      [](void* p, int64_t c) {
        const Split& s = *static_cast<const Split*>(p);
        const int64_t lo = s.units * c / s.chunks * s.grain;
        const int64_t hi =
            std::min(s.n, s.units * (c + 1) / s.chunks * s.grain);
        if (lo < hi) (*s.fn)(lo, hi);
      },
      &split);
}

// Calls fn(i) for every i in [0, n), items claimed one at a time (groups of
// consecutive items past ComputePool::kMaxChunks): for items of uneven cost
// (e.g. attention rows of causal prefill).
template <typename Fn>
void ParallelForEach(int64_t n, Fn&& fn) {
  if (n <= 0) return;
  if (NumThreads() <= 1 || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  struct Items {
    std::remove_reference_t<Fn>* fn;
    int64_t n, chunks;
  } items{&fn, n, std::min(n, ComputePool::kMaxChunks)};
  internal::RunChunks(
      items.chunks,
      [](void* p, int64_t c) {
        const Items& s = *static_cast<const Items*>(p);
        const int64_t end = s.n * (c + 1) / s.chunks;
        for (int64_t i = s.n * c / s.chunks; i < end; ++i) (*s.fn)(i);
      },
      &items);
}

}  // namespace kvserve
