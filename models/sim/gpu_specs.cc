#include "models/sim/gpu_specs.h"

#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/strings.h"

namespace kvserve::models::sim {
namespace {

constexpr double kGB = 1e9;
constexpr double kTB = 1e12;
constexpr double kTFlop = 1e12;

// NVIDIA's datasheets (SXM parts where there are several): H100 and H200
// share the Hopper die's rates; NVLink 900 GB/s total is 450 per direction;
// PCIe Gen5 x16 64 GB/s, Gen4 x16 32 GB/s per direction.
constexpr std::array<GpuSpec, 4> kGpus = {{
    {"h100", "H100 SXM 80GB", 80'000'000'000, 3.35 * kTB, 989.4 * kTFlop,
     1978.9 * kTFlop, 64 * kGB, 450 * kGB},
    {"h200", "H200 SXM 141GB", 141'000'000'000, 4.8 * kTB, 989.4 * kTFlop,
     1978.9 * kTFlop, 64 * kGB, 450 * kGB},
    {"a100", "A100 SXM 80GB", 80'000'000'000, 2.039 * kTB, 312 * kTFlop, 0,
     32 * kGB, 300 * kGB},
    {"l40s", "L40S 48GB", 48'000'000'000, 0.864 * kTB, 362.05 * kTFlop,
     733 * kTFlop, 32 * kGB, 0},
}};

}  // namespace

absl::StatusOr<GpuSpec> FindGpu(std::string_view name) {
  const std::string lower = absl::AsciiStrToLower(AbslView(name));
  for (const GpuSpec& g : kGpus) {
    if (g.name == lower) return g;
  }
  return absl::NotFoundError(absl::StrCat("unknown GPU '", AbslView(name),
                                          "' (known: ", GpuNames(), ")"));
}

std::string GpuNames() {
  return absl::StrJoin(kGpus, ", ", [](std::string* out, const GpuSpec& g) {
    absl::StrAppend(out, AbslView(g.name));
  });
}

}  // namespace kvserve::models::sim
