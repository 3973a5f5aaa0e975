#include "common/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"

namespace kvserve {
namespace {
// An environment variable's integer at least `min`; a value that is not
// one is named on stderr and ignored (the caller's default applies).
std::optional<int64_t> EnvInt(const char* name, int64_t min) {
  const char* env = std::getenv(name);
  if (env == nullptr) return std::nullopt;
  int64_t v = 0;
  if (absl::SimpleAtoi(env, &v) && v >= min) return v;
  std::fprintf(stderr, "kvserve: ignoring %s=%s (not an integer >= %lld)\n",
               name, env, static_cast<long long>(min));
  return std::nullopt;
}

int DefaultThreads() {
  if (const auto n = EnvInt("KVSERVE_THREADS", 1)) {
    return static_cast<int>(std::min<int64_t>(*n, 1 << 16));
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
    if (const auto us = EnvInt("KVSERVE_POOL_SPIN_US", 0)) {
      return std::chrono::microseconds(*us);
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
