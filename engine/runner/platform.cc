#include "engine/runner/platform.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/runner/cpu_backend.h"
#include "engine/runner/sim_backend.h"
#ifdef KVSERVE_CUDA
#include "engine/runner/cuda_backend.h"
#endif

namespace kvserve::engine {
namespace {

using kvcache::KvDtype;

std::string Name(KvDtype d) { return std::string(kvcache::KvDtypeName(d)); }

absl::Status ShapeFits(KvDtype d, int head_dim) {
  if (absl::Status s = kvcache::CheckKvDtypeShape(d, head_dim); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-dtype: ", s.message()));
  }
  return absl::OkStatus();
}

class CpuPlatform final : public Platform {
 public:
  Device device() const override { return Device::kCpu; }
  absl::Status Check() const override { return absl::OkStatus(); }
  absl::StatusOr<KvDtype> ResolveKvDtype(std::optional<KvDtype> requested,
                                         int head_dim) const override {
    const KvDtype d = requested.value_or(DefaultCpuKvDtype(head_dim));
    if (d == KvDtype::kFP8) {
      return absl::InvalidArgumentError(
          "--kv-cache-dtype fp8: the CPU backend stores f32, bf16, fp16, "
          "int8, int4, int3 or int2 KV (fp8 is a CUDA dtype)");
    }
    KV_RETURN_IF_ERROR(ShapeFits(d, head_dim));
    return d;
  }
  WeightForm weight_form() const override { return WeightForm::kPacked; }
  absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
      const BackendConfig& config, LoadedModel* model) const override {
    return CreateCpuBackend(config, model);
  }
};

class CudaPlatform final : public Platform {
 public:
  Device device() const override { return Device::kCuda; }
  absl::Status Check() const override {
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
  absl::StatusOr<KvDtype> ResolveKvDtype(std::optional<KvDtype> requested,
                                         int head_dim) const override {
    const KvDtype d = requested.value_or(KvDtype::kBF16);
    if (d != KvDtype::kBF16 && d != KvDtype::kFP8 && d != KvDtype::kInt8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-cache-dtype ", Name(d),
          ": the CUDA backend stores bf16, fp8 (e4m3) or int8 KV (use "
          "auto, bf16, fp8 or int8, or --device cpu for f32, fp16 and "
          "int4)"));
    }
    // Shapes: CheckInt8Shape and CudaLlamaModel::Create name what they
    // refuse when the backend is built.
    return d;
  }
  WeightForm weight_form() const override { return WeightForm::kRaw; }
  absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
      const BackendConfig& config, LoadedModel* model) const override {
    KV_RETURN_IF_ERROR(Check());
#ifdef KVSERVE_CUDA
    return CreateCudaBackend(config, model);
#else
    return absl::InternalError("unreachable: Check() refuses CUDA here");
#endif
  }
};

class SimPlatform final : public Platform {
 public:
  Device device() const override { return Device::kSim; }
  absl::Status Check() const override { return absl::OkStatus(); }
  absl::StatusOr<KvDtype> ResolveKvDtype(std::optional<KvDtype> requested,
                                         int head_dim) const override {
    const KvDtype d = requested.value_or(kDefaultSimKvDtype);
    if (d != KvDtype::kBF16 && d != KvDtype::kFP8 && d != KvDtype::kInt8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-cache-dtype ", Name(d),
          ": the simulated GPU stores what the CUDA backend stores: bf16, "
          "fp8 or int8"));
    }
    KV_RETURN_IF_ERROR(kvcache::CheckKvDtypeShape(d, head_dim));
    return d;
  }
  WeightForm weight_form() const override { return WeightForm::kNone; }
  absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
      const BackendConfig& config, LoadedModel* model) const override {
    return CreateSimBackend(config, model);
  }
};

}  // namespace

const Platform& PlatformFor(Device device) {
  static const CpuPlatform* const kCpu = new CpuPlatform;
  static const CudaPlatform* const kCuda = new CudaPlatform;
  static const SimPlatform* const kSim = new SimPlatform;
  switch (ResolveDevice(device)) {
    case Device::kCuda:
      return *kCuda;
    case Device::kSim:
      return *kSim;
    case Device::kCpu:
    case Device::kAuto:
      break;
  }
  return *kCpu;
}

}  // namespace kvserve::engine
