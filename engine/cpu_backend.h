// The CPU backend: the packed CpuLlamaModel, KV blocks in host memory
// (KvCacheStorage, in the configured KV dtype), and a host swap area of
// whole blocks.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "engine/model_backend.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::engine {

// The CPU's KV dtype when none is asked for.
inline constexpr kvcache::KvDtype kDefaultCpuKvDtype = kvcache::KvDtype::kF16;

// The dtype the CPU backend stores for `requested` (nullopt: the default),
// or InvalidArgument naming --kv-cache-dtype and why it cannot run.
[[nodiscard]] absl::StatusOr<kvcache::KvDtype> CpuKvDtype(
    std::optional<kvcache::KvDtype> requested, int head_dim);

[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateCpuBackend(
    const BackendConfig& config, LoadedModel* model);

}  // namespace kvserve::engine
