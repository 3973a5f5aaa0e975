// The CPU backend: the packed CpuLlamaModel, KV blocks in host memory
// (KvCacheStorage, in the configured KV dtype), and a host swap area of
// whole blocks.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "engine/runner/model_backend.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::engine {

// The CPU's KV dtype when none is asked for: int8 (q8_0 groups, stored
// Hadamard-rotated, kvcache::KvRotationFor) where the rotation applies,
// fp16 otherwise. By `kvserve eval` on the default model int8 costs +0.005%
// perplexity and a mean KL divergence of 0.0042 against f32 KV (fp16:
// 0.0037), inside the bounds for a default (0.5%, 0.005), at 53% of fp16's
// bytes; unrotated it cost 0.0052.
[[nodiscard]] kvcache::KvDtype DefaultCpuKvDtype(int head_dim);

// The dtype for a request: PlatformFor(Device::kCpu).ResolveKvDtype
// (engine/platform.h).

[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateCpuBackend(
    const BackendConfig& config, LoadedModel* model);

}  // namespace kvserve::engine
