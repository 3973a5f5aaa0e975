// The device a model runs on, as the --device flag names it.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace kvserve::engine {

// kAuto resolves to kCuda when the build has CUDA and a device is visible,
// else kCpu (ResolveDevice in engine/model_backend.h).
enum class Device { kCpu, kCuda, kAuto };

// "cpu" | "cuda" | "auto"; InvalidArgument naming --device otherwise.
[[nodiscard]] absl::StatusOr<Device> ParseDevice(std::string_view name);
// The flag value of `device`: "cpu", "cuda" or "auto".
[[nodiscard]] std::string_view DeviceName(Device device);

}  // namespace kvserve::engine
