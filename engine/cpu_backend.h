// The CPU backend: the packed LlamaModel, fp32 KV blocks in host memory
// (KvCacheStorage), and a host swap area of whole blocks.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/model_backend.h"

namespace kvserve::engine {

[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateCpuBackend(
    const BackendConfig& config, LoadedModel* model);

}  // namespace kvserve::engine
