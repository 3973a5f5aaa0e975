#include "common/parallel.h"

#include <atomic>
#include <cstdlib>
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
}  // namespace

int NumThreads() { return ThreadsSetting().load(std::memory_order_relaxed); }
void SetNumThreads(int n) {
  ThreadsSetting().store(n > 0 ? n : DefaultThreads(),
                         std::memory_order_relaxed);
}

}  // namespace kvserve
