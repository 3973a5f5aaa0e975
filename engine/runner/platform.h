// Platform: one device as the engine runs on it, the one place that decides
// a device's rules: whether it can run here, which KV dtypes it stores and
// which it picks when none is asked for, what a model load keeps of the
// weights for it, and the backend it builds. One per device (CPU, CUDA,
// simulated); PlatformFor(device) is how the rest of the code asks, so that
// outside the device half a device is named only where flags are parsed.
#pragma once

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/runner/device.h"
#include "engine/runner/model_backend.h"
#include "kvcache/kv_format.h"

namespace kvserve::engine {

struct LoadedModel;

// What a model load keeps of the weights for a device.
enum class WeightForm {
  kPacked,  // the CPU's packed model (LoadedModel::model)
  kRaw,     // the checked weights, for an upload (LoadedModel::weights)
  kNone,    // none: config and tokenizer only (the simulated device)
};

class Platform {
 public:
  virtual ~Platform() = default;

  [[nodiscard]] virtual Device device() const = 0;
  // OK when the device can run here; FailedPrecondition naming --device
  // and what to do otherwise. Cheap: callers fail before loading weights.
  [[nodiscard]] virtual absl::Status Check() const = 0;
  // The KV dtype the device stores for `requested` (nullopt: its default)
  // with rows of `head_dim`; InvalidArgument naming --kv-cache-dtype and
  // what the device stores otherwise.
  [[nodiscard]] virtual absl::StatusOr<kvcache::KvDtype> ResolveKvDtype(
      std::optional<kvcache::KvDtype> requested, int head_dim) const = 0;
  [[nodiscard]] virtual WeightForm weight_form() const = 0;
  // True when no model runs (tokens and step times are simulated).
  [[nodiscard]] bool simulated() const {
    return weight_form() == WeightForm::kNone;
  }
  // Builds the backend from `model` (the form weight_form() names).
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<ModelBackend>>
  CreateBackend(const BackendConfig& config, LoadedModel* model) const = 0;
};

// The platform of `device`, kAuto resolved (ResolveDevice). Never null;
// lives as long as the process.
[[nodiscard]] const Platform& PlatformFor(Device device);

}  // namespace kvserve::engine
