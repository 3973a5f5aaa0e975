#include "models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_format.h"

namespace kvserve::models {

absl::Status ApplyLinearRopeScale(float factor, ModelConfig* config) {
  if (!(factor >= 1.0f && factor <= 64.0f)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--rope-scale %g must be in [1, 64]", static_cast<double>(factor)));
  }
  if (factor == 1.0f) return absl::OkStatus();
  if (config->rope_scaling.type != RopeScalingType::kNone) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--rope-scale %g: the model already scales RoPE (%s, factor %g); "
        "a second scaling is not one it was trained with",
        static_cast<double>(factor),
        RopeScalingTypeName(config->rope_scaling.type),
        static_cast<double>(config->rope_scaling.factor)));
  }
  config->rope_scaling.type = RopeScalingType::kLinear;
  config->rope_scaling.factor = factor;
  config->rope_scaling.original_max_position = config->max_position;
  config->max_position = static_cast<int>(std::min<double>(
      static_cast<double>(config->max_position) * factor, double{1 << 24}));
  return absl::OkStatus();
}

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
