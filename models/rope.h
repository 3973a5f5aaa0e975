// Rotary position embedding: inverse frequencies (with Llama-3 / linear
// scaling) and rotation of Q/K head vectors in either pairing layout.
#pragma once

#include <cstdint>
#include <vector>

#include "models/model_config.h"

namespace kvserve::models {

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
