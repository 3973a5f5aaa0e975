#include "kvtier/tier.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace kvserve::kvtier {

int64_t DrainWriteQueue(std::unique_lock<std::mutex>& lock,
                        std::condition_variable& idle,
                        std::deque<StoreItem>& queue, const bool& writing,
                        absl::Time deadline) {
  while (!queue.empty() || writing) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    idle.wait_for(lock, absl::ToChronoNanoseconds(
                            std::min(left, absl::Milliseconds(50))));
  }
  const auto dropped = static_cast<int64_t>(queue.size());
  queue.clear();
  return dropped;
}

}  // namespace kvserve::kvtier
