#include "engine/runner/model_backend.h"

#include "absl/strings/str_cat.h"
#include "engine/runner/platform.h"
#ifdef KVSERVE_CUDA
#include "engine/runner/cuda_backend.h"  // CudaDeviceCount
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
  return PlatformFor(requested).Check();
}

absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
    const BackendConfig& config, LoadedModel* model) {
  const Platform& platform = PlatformFor(config.device);
  if (absl::Status s = platform.Check(); !s.ok()) return s;
  return platform.CreateBackend(config, model);
}

}  // namespace kvserve::engine
