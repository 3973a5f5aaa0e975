#include "models/model_config.h"

#include "absl/strings/str_format.h"

namespace kvserve::models {

absl::Status ModelConfig::Validate() const {
  auto positive = [&](const char* field, int v) -> absl::Status {
    if (v <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "model config '%s': %s must be > 0, got %d", name, field, v));
    }
    return absl::OkStatus();
  };
  for (auto [field, v] : {std::pair<const char*, int>{"num_layers", num_layers},
                          {"hidden_size", hidden_size},
                          {"num_heads", num_heads},
                          {"num_kv_heads", num_kv_heads},
                          {"head_dim", head_dim},
                          {"intermediate_size", intermediate_size},
                          {"vocab_size", vocab_size}}) {
    absl::Status s = positive(field, v);
    if (!s.ok()) return s;
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model config '%s': num_heads (%d) must be a multiple of "
        "num_kv_heads (%d)",
        name, num_heads, num_kv_heads));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model config '%s': head_dim must be even for RoPE, got %d", name,
        head_dim));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::models
