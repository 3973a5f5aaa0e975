#include "models/rope.h"

#include <cmath>
#include <numbers>

namespace kvserve::models {

Rope::Rope(const ModelConfig& config)
    : head_dim_(config.head_dim), style_(config.rope_style) {
  const int half = head_dim_ / 2;
  inv_freq_.resize(half);
  const RopeScaling& rs = config.rope_scaling;
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(static_cast<double>(config.rope_theta),
                              2.0 * i / head_dim_);
    if (rs.type == RopeScalingType::kLinear) {
      f /= rs.factor;
    } else if (rs.type == RopeScalingType::kLlama3) {
      // Keep high frequencies, divide low ones by `factor`, blend between.
      const double orig = rs.original_max_position;
      const double wavelen = 2.0 * std::numbers::pi / f;
      const double low_wavelen = orig / rs.low_freq_factor;
      const double high_wavelen = orig / rs.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= rs.factor;
      } else if (wavelen >= high_wavelen) {
        const double s = (orig / wavelen - rs.low_freq_factor) /
                         (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - s) * f / rs.factor + s * f;
      }
    }
    inv_freq_[i] = static_cast<float>(f);
  }
}

void Rope::Tables(const int32_t* positions, int64_t n, float* cos_out,
                  float* sin_out) const {
  const int half = head_dim_ / 2;
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < half; ++i) {
      // Angle in double: positions up to 128K times frequencies near 1 lose
      // precision in float.
      const double a = static_cast<double>(positions[t]) * inv_freq_[i];
      cos_out[t * half + i] = static_cast<float>(std::cos(a));
      sin_out[t * half + i] = static_cast<float>(std::sin(a));
    }
  }
}

void Rope::Apply(float* x, int num_heads, const float* cos_row,
                 const float* sin_row) const {
  const int half = head_dim_ / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim_;
    if (style_ == RopeStyle::kInterleaved) {
      for (int i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos_row[i] - b * sin_row[i];
        v[2 * i + 1] = a * sin_row[i] + b * cos_row[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_row[i] - b * sin_row[i];
        v[i + half] = a * sin_row[i] + b * cos_row[i];
      }
    }
  }
}

}  // namespace kvserve::models
