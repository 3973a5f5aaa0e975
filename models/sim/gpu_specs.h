// The datasheet numbers of the GPUs that `kvserve plan --gpu` and the
// roofline cost model know: memory, its bandwidth, dense matrix rates and
// the links to the host and between GPUs. Dense rates (no structured
// sparsity); bandwidths per direction.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve::models::sim {

struct GpuSpec {
  std::string_view name;     // "h200"
  std::string_view part;     // "H200 SXM 141GB"
  int64_t memory_bytes = 0;  // marketed capacity, decimal GB
  double memory_bw = 0;      // bytes/s
  double bf16_flops = 0;     // dense FLOP/s
  double fp8_flops = 0;      // dense FLOP/s; 0: no fp8 matrix units
  double host_link_bw = 0;   // PCIe, bytes/s per direction
  double peer_link_bw = 0;   // NVLink, bytes/s per direction; 0: PCIe
};

// The spec of `name` (case-insensitive: h100, h200, a100, l40s); NotFound
// naming the known ones otherwise.
[[nodiscard]] absl::StatusOr<GpuSpec> FindGpu(std::string_view name);

// "h100, h200, a100, l40s".
[[nodiscard]] std::string GpuNames();

}  // namespace kvserve::models::sim
