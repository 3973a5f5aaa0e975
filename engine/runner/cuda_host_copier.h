// The CUDA backend's host KV cache (engine/runner/host_kv_copier.h): pinned
// slots, a copy stream, and a ring of device staging regions for the
// gathers of CopyToHost. Defined only when the build has CUDA.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/runner/host_kv_copier.h"

namespace kvserve::models::cuda {
struct CudaKvCache;
}  // namespace kvserve::models::cuda

namespace kvserve::engine {

// `slots` host slots of `bytes_per_block` (= num_planes x block_bytes) for
// the pool `kv`, whose model stream is `model_stream` (a cudaStream_t).
// The staging ring takes at most 64 MiB of device memory (at least two
// blocks); the caller counts it in its device budget.
[[nodiscard]] absl::StatusOr<std::unique_ptr<HostKvCopier>>
CreateCudaHostCopier(const models::cuda::CudaKvCache* kv, int num_planes,
                     int64_t block_bytes, int32_t slots, void* model_stream);

// Device bytes CreateCudaHostCopier's staging takes for blocks of
// `bytes_per_block`.
[[nodiscard]] int64_t CudaHostCopierStagingBytes(int64_t bytes_per_block,
                                                 int32_t slots);

}  // namespace kvserve::engine
