// The simulated device ("--device sim:h200x2"): a backend that runs no
// model. It holds no weights and no KV bytes, only the numbers: its pool is
// the block count the named GPU would hold (models/sim/memory_budget.h, the
// function `kvserve plan --gpu` uses), each step takes the roofline time of
// its batch (models/sim/roofline.h) scaled by SimConfig::speed, swaps and
// copy-on-write copies cost their bytes over PCIe and HBM, and every
// requested row gets a seeded pseudo-random token id. Everything around the
// forward (servers, validation, tokenizer, scheduler, KV manager, prefix
// cache, preemption, metrics) is the real engine's.
//
// Token ids: a hash of (seed, the row's input token, its position), so a
// sequence's output depends on its own tokens alone (batch-invariant, as
// the real backends) and the same request gives the same output. Never an
// end-of-generation or control id: requests end at max_tokens or at their
// own stop ids or strings.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "engine/runner/model_backend.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::engine {

// The simulated device's KV dtype when none is asked for: bf16, as CUDA.
inline constexpr kvcache::KvDtype kDefaultSimKvDtype = kvcache::KvDtype::kBF16;

// It stores the CUDA backend's set (bf16, fp8, int8):
// PlatformFor(Device::kSim).ResolveKvDtype (engine/platform.h).

// Needs `model`'s config and tokenizer only. The pool: config.kv_cache_bytes
// when set, else the GPU's memory minus the weights at sim.weight_bytes per
// parameter (the config's weight dtype when 0) per rank minus
// 1 - gpu_memory_fraction of it. FailedPrecondition naming the GPU, the
// weights and the flags to change when nothing is left for KV.
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateSimBackend(
    const BackendConfig& config, LoadedModel* model);

}  // namespace kvserve::engine
