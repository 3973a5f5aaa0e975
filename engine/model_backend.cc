#include "engine/model_backend.h"

#include "absl/strings/str_cat.h"
#include "engine/cpu_backend.h"
#ifdef KVSERVE_CUDA
#include "engine/cuda_backend.h"
#endif

namespace kvserve::engine {

std::string ResolveDevice(std::string_view requested) {
  if (requested != "auto") return std::string(requested);
    // The SIMT emulator (KVSERVE_CUDA_EMU) is a test device: only an explicit
    // --device=cuda selects it.
#if defined(KVSERVE_CUDA) && !defined(KVSERVE_CUDA_EMU)
  if (CudaDeviceCount() > 0) return "cuda";
#endif
  return "cpu";
}

absl::Status CheckDevice(std::string_view requested) {
  const std::string device = ResolveDevice(requested);
  if (device == "cpu") return absl::OkStatus();
  if (device == "cuda") {
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
  return absl::InvalidArgumentError(absl::StrCat(
      "--device: must be cpu, cuda, or auto, got \"", device, "\""));
}

absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
    const BackendConfig& config, LoadedModel* model) {
  const std::string device = ResolveDevice(config.device);
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
#ifdef KVSERVE_CUDA
  if (device == "cuda") return CreateCudaBackend(config, model);
#endif
  return CreateCpuBackend(config, model);  // CheckDevice passed: "cpu"
}

}  // namespace kvserve::engine
