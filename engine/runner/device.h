// The device a model runs on, as the --device flag names it, and the
// settings of the simulated device ("sim:<gpu>[x<tp>]").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvserve::models::sim {
struct StepProfile;  // models/sim/step_profile.h
}  // namespace kvserve::models::sim

namespace kvserve::engine {

// kAuto resolves to kCuda when the build has CUDA and a device is visible,
// else kCpu (ResolveDevice in engine/model_backend.h). kSim runs no model:
// engine/sim_backend.h.
enum class Device { kCpu, kCuda, kAuto, kSim };

// "cpu" | "cuda" | "auto" | "sim:<gpu>[x<tp>]"; InvalidArgument naming
// --device otherwise (a sim value is checked by ParseSimTarget).
[[nodiscard]] absl::StatusOr<Device> ParseDevice(std::string_view name);
// The flag value of `device`: "cpu", "cuda", "auto" or "sim".
[[nodiscard]] std::string_view DeviceName(Device device);

// The simulated device: which GPU, how many tensor-parallel ranks, and how
// the simulation runs. The serve flags --sim-* fill it.
struct SimConfig {
  std::string gpu = "h200";  // models/sim/gpu_specs.h
  int tp = 1;
  // Simulated seconds per real second: 1 sleeps each step's modelled time
  // (a client sees realistic TTFT and TPOT), 10 sleeps a tenth of it, 0 not
  // at all (steps run as fast as the host allows).
  double speed = 1.0;
  double weight_bytes = 0;  // per parameter; 0: the model config's
  uint64_t seed = 0;        // of the simulated token ids
  // Shares of the GPU's memory bandwidth and matrix rate a step reaches,
  // and the host's microseconds per sequence of a step; unset: the
  // defaults of models/sim/roofline.h's Efficiency.
  std::optional<double> memory_efficiency, flops_efficiency, host_us_per_seq;
  // When set, each step's simulated duration (swaps and copies included) is
  // handed to it on the engine thread instead of slept: a trace replay
  // advances its virtual clock with it (cli/sim_replay.h). `speed` is then
  // ignored.
  std::function<void(absl::Duration)> step_sink;
  // A measured step-time model (--sim-profile) instead of the roofline.
  std::shared_ptr<const models::sim::StepProfile> profile;
};

// The GPU and tensor-parallel ranks of "sim:h200" / "sim:h100x2" into
// `gpu` and `tp` of a copy of `base`. InvalidArgument naming --device and
// the known GPUs otherwise.
[[nodiscard]] absl::StatusOr<SimConfig> ParseSimTarget(std::string_view name,
                                                       SimConfig base = {});

}  // namespace kvserve::engine
