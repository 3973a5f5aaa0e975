// Rotary position embedding: inverse frequencies (with Llama-3 / linear
// scaling) and rotation of Q/K head vectors in either pairing layout.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "models/model_config.h"

namespace kvserve::models {

// Linear RoPE scaling chosen at start (llama.cpp's --rope-scale, vLLM's
// rope_scaling {"rope_type": "linear"}): positions are divided by `factor`
// and the context grows by it. factor 1 leaves `config` as it is. Refused
// for a factor outside [1, 64] and for a model whose RoPE already scales
// (two scalings do not compose into one the model was trained with).
[[nodiscard]] absl::Status ApplyLinearRopeScale(float factor,
                                                ModelConfig* config);

class Rope {
 public:
  explicit Rope(const ModelConfig& config);

  // Fills cos/sin tables [n, head_dim / 2] for the given positions.
  void Tables(const int32_t* positions, int64_t n, float* cos_out,
              float* sin_out) const;
  // Rotates `num_heads` consecutive head vectors of one token in place.
  void Apply(float* x, int num_heads, const float* cos_row,
             const float* sin_row) const;

  const std::vector<float>& inv_freq() const { return inv_freq_; }

 private:
  int head_dim_;
  RopeStyle style_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
};

}  // namespace kvserve::models
