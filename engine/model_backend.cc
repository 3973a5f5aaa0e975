#include "engine/model_backend.h"

#include "absl/strings/str_cat.h"
#include "engine/cpu_backend.h"
#include "engine/sim_backend.h"
#ifdef KVSERVE_CUDA
#include "engine/cuda_backend.h"
#endif

namespace kvserve::engine {

Device ResolveDevice(Device requested) {
  if (requested != Device::kAuto) return requested;
    // The SIMT emulator (KVSERVE_CUDA_EMU) is a test device: only an explicit
    // --device=cuda selects it.
#if defined(KVSERVE_CUDA) && !defined(KVSERVE_CUDA_EMU)
  if (CudaDeviceCount() > 0) return Device::kCuda;
#endif
  return Device::kCpu;
}

absl::Status CheckDevice(Device requested) {
  const Device d = ResolveDevice(requested);
  if (d == Device::kCpu || d == Device::kSim) return absl::OkStatus();
#ifdef KVSERVE_CUDA
  if (CudaDeviceCount() <= 0) {
    return absl::FailedPreconditionError(
        "--device=cuda: no CUDA device is visible (check the driver and "
        "CUDA_VISIBLE_DEVICES), or use --device=cpu");
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "--device=cuda: this build has no CUDA support (configure with "
      "-DKVSERVE_CUDA=ON and nvcc on PATH), or use --device=cpu");
#endif
}

absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
    const BackendConfig& config, LoadedModel* model) {
  const Device device = ResolveDevice(config.device);
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  if (device == Device::kSim) return CreateSimBackend(config, model);
#ifdef KVSERVE_CUDA
  if (device == Device::kCuda) return CreateCudaBackend(config, model);
#endif
  return CreateCpuBackend(config, model);  // CheckDevice passed: the CPU
}

}  // namespace kvserve::engine
