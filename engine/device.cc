#include "engine/device.h"

#include "absl/strings/str_cat.h"
#include "common/strings.h"

namespace kvserve::engine {

absl::StatusOr<Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  if (name == "auto") return Device::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(
      "--device: must be cpu, cuda, or auto, got \"", AbslView(name), "\""));
}

std::string_view DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
    case Device::kAuto:
      return "auto";
  }
  return "cpu";
}

}  // namespace kvserve::engine
