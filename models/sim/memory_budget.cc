#include "models/sim/memory_budget.h"

#include <algorithm>
#include <cmath>

namespace kvserve::models::sim {

MemoryBudget KvMemoryBudget(const GpuSpec& gpu, int64_t params,
                            double weight_bytes, int tp,
                            double reserve_fraction) {
  MemoryBudget b;
  b.hbm_bytes = gpu.memory_bytes;
  b.weight_bytes_per_rank = static_cast<int64_t>(
      std::ceil(static_cast<double>(params) * weight_bytes / std::max(tp, 1)));
  // Rounded, so 1 - 0.9 and 0.1 reserve the same bytes.
  b.reserve_bytes =
      std::llround(static_cast<double>(b.hbm_bytes) * reserve_fraction);
  b.kv_bytes = std::max<int64_t>(
      0, b.hbm_bytes - b.weight_bytes_per_rank - b.reserve_bytes);
  return b;
}

}  // namespace kvserve::models::sim
