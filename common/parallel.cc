#include "common/parallel.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

namespace kvserve {
namespace {
int DefaultThreads() {
  if (const char* env = std::getenv("KVSERVE_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}
std::atomic<int>& ThreadsSetting() {
  static std::atomic<int> n{DefaultThreads()};
  return n;
}

// How long an idle worker polls before parking. Jobs of one forward pass
// come microseconds apart; the gap between engine steps is longer, and a
// spinning worker there would take a core from the server's threads.
std::chrono::microseconds SpinTime() {
  static const std::chrono::microseconds spin = [] {
    if (const char* env = std::getenv("KVSERVE_POOL_SPIN_US")) {
      const long us = std::atol(env);
      if (us >= 0) return std::chrono::microseconds(us);
    }
    return std::chrono::microseconds(200);
  }();
  return spin;
}

// The shared pool, rebuilt when the thread count changes. Callers hold a
// reference for the duration of a job, so a rebuild never frees a pool in
// use.
std::shared_ptr<ComputePool> SharedPool(int threads) {
  static std::mutex mu;
  static std::shared_ptr<ComputePool>* pool =
      new std::shared_ptr<ComputePool>();  // never destroyed: no exit race
  std::lock_guard<std::mutex> lock(mu);
  if (*pool == nullptr || (*pool)->workers() != threads - 1) {
    *pool = std::make_shared<ComputePool>(threads - 1, SpinTime());
  }
  return *pool;
}
}  // namespace

int NumThreads() { return ThreadsSetting().load(std::memory_order_relaxed); }
void SetNumThreads(int n) {
  ThreadsSetting().store(n > 0 ? n : DefaultThreads(),
                         std::memory_order_relaxed);
}

namespace internal {
void RunChunks(int64_t chunks, ComputePool::ChunkFn fn, void* ctx) {
  SharedPool(NumThreads())->Run(chunks, fn, ctx);
}
}  // namespace internal

}  // namespace kvserve
