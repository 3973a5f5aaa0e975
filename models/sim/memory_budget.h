// How much of a GPU's memory is left for the KV cache: its capacity minus
// one rank's share of the weights minus what is kept back for activations,
// the CUDA context and allocator slack. `kvserve plan --gpu` and the
// simulated device size the pool with this one function, so the plan and a
// simulated server agree to the block.
#pragma once

#include <cstdint>

#include "models/sim/gpu_specs.h"

namespace kvserve::models::sim {

// Share of device memory kept back (vLLM's default gpu_memory_utilization
// of 0.9 keeps back the same 10%).
inline constexpr double kDefaultReserveFraction = 0.10;

struct MemoryBudget {
  int64_t hbm_bytes = 0;
  int64_t weight_bytes_per_rank = 0;  // ceil(params x bytes / tp)
  int64_t reserve_bytes = 0;          // hbm x reserve_fraction
  int64_t kv_bytes = 0;               // what is left, never negative
};

// `params` parameters of `weight_bytes` bytes each, split over `tp` ranks,
// on `gpu`. reserve_fraction in [0, 1); tp >= 1.
[[nodiscard]] MemoryBudget KvMemoryBudget(
    const GpuSpec& gpu, int64_t params, double weight_bytes, int tp,
    double reserve_fraction = kDefaultReserveFraction);

}  // namespace kvserve::models::sim
