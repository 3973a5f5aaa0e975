#include "engine/runner/device.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "models/sim/gpu_specs.h"

namespace kvserve::engine {

absl::StatusOr<Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "auto") return Device::kAuto;
  if (name.starts_with("sim:")) {
    absl::StatusOr<SimConfig> sim = ParseSimTarget(name);
    if (!sim.ok()) return sim.status();
    return Device::kSim;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device: must be cpu, cuda, auto, or sim:<gpu>[x<tp>], "
                   "got \"",
                   AbslView(name), "\""));
}

std::string_view DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
    case Device::kAuto:
      return "auto";
    case Device::kSim:
      return "sim";
  }
  return "cpu";
}

absl::StatusOr<SimConfig> ParseSimTarget(std::string_view name,
                                         SimConfig base) {
  const auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device \"", AbslView(name), "\": ", AbslView(why),
                     " (sim:<gpu>[x<tp>], gpu one of ", models::sim::GpuNames(),
                     ", e.g. sim:h200x2)"));
  };
  if (!name.starts_with("sim:")) return bad("not a sim device");
  name.remove_prefix(4);
  std::string_view gpu = name;
  int tp = 1;
  if (const size_t x = name.rfind('x'); x != std::string_view::npos) {
    gpu = name.substr(0, x);
    if (!absl::SimpleAtoi(AbslView(name.substr(x + 1)), &tp) || tp < 1 ||
        tp > 64) {
      return bad("the tensor-parallel ranks must be 1 to 64");
    }
  }
  if (!models::sim::FindGpu(gpu).ok()) return bad("unknown GPU");
  base.gpu = absl::AsciiStrToLower(AbslView(gpu));
  base.tp = tp;
  return base;
}

}  // namespace kvserve::engine
