// The CUDA backend: the Llama forward on one GPU (models/cuda/), bf16, fp8
// (e4m3) or int8 (q8_0) KV blocks in device memory sized after the weights
// and a profiling forward, and a pinned host swap area of whole blocks.
// Declared in every build; defined only when the build has CUDA
// (KVSERVE_CUDA).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/runner/model_backend.h"

namespace kvserve::engine {

// Number of visible CUDA devices; 0 when there is no driver, no device, or
// the runtime reports an error (treated as "CPU only", never a crash).
int CudaDeviceCount();

// Uploads `model->weights` (LoadModel with device "cuda" keeps them; else
// the weights are re-read from model->path and the packed CPU model is
// dropped; released after the upload), profiles one forward of
// config.max_num_batched_tokens tokens, then allocates the KV blocks:
// config.kv_cache_bytes if set, else gpu_memory_fraction of device memory minus
// what is in use. Errors name the flag (--gpu-memory-fraction,
// --kv-cache-bytes) or the CUDA call.
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateCudaBackend(
    const BackendConfig& config, LoadedModel* model);

}  // namespace kvserve::engine
