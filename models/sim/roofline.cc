#include "models/sim/roofline.h"

#include <algorithm>

namespace kvserve::models::sim {
namespace {

int64_t CountMatmulParams(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t per_layer =
      h * q + 2 * h * kv + q * h + 3 * h * int64_t{c.intermediate_size};
  return c.num_layers * per_layer + int64_t{c.vocab_size} * h;
}

}  // namespace

Roofline::Roofline(const ModelConfig& config, const GpuSpec& gpu, int tp,
                   double weight_bytes, int64_t kv_bytes_per_token,
                   Efficiency eff, AttentionUnits attention)
    : config_(config),
      gpu_(gpu),
      tp_(std::max(tp, 1)),
      weight_bytes_(weight_bytes),
      kv_bytes_per_token_(kv_bytes_per_token),
      eff_(eff),
      matmul_params_(CountMatmulParams(config)),
      peak_flops_(weight_bytes <= 1.0 && gpu.fp8_flops > 0 ? gpu.fp8_flops
                                                           : gpu.bf16_flops),
      attention_flops_(attention == AttentionUnits::kFp8 ? peak_flops_
                                                         : gpu.bf16_flops) {}

StepCost Roofline::Step(const StepLoad& load) const {
  StepCost c;
  const double bw = gpu_.memory_bw * eff_.memory;
  c.weights_s = static_cast<double>(matmul_params_) * weight_bytes_ / tp_ / bw;
  // K/V read for the cached tokens, written for the new ones.
  c.kv_s = static_cast<double>(load.kv_read_tokens + load.tokens) *
           static_cast<double>(kv_bytes_per_token_) / bw;
  const double matmul_flops =
      2.0 * static_cast<double>(matmul_params_) / tp_ * load.tokens;
  // QK^T and PV: 2 FLOPs each per head dimension per attended key.
  const double attn_flops = 4.0 * config_.num_layers * config_.num_heads *
                            config_.head_dim *
                            static_cast<double>(load.attended) / tp_;
  c.compute_s =
      (matmul_flops / peak_flops_ + attn_flops / attention_flops_) / eff_.flops;
  if (tp_ > 1 && load.tokens > 0) {
    // Ring all-reduce of the bf16 activations after attention and MLP.
    const double link =
        gpu_.peer_link_bw > 0 ? gpu_.peer_link_bw : gpu_.host_link_bw;
    const double bytes = 2.0 * config_.hidden_size * load.tokens;
    const double one = 2.0 * (tp_ - 1) / tp_ * bytes / (link * eff_.link) +
                       eff_.link_latency_s;
    c.allreduce_s = 2.0 * config_.num_layers * one;
  }
  c.host_s = eff_.host_s_per_seq * static_cast<double>(load.seqs);
  const double memory_s = c.weights_s + c.kv_s;
  c.compute_bound = c.compute_s > memory_s;
  c.total_s = std::max(memory_s, c.compute_s) + c.allreduce_s + c.host_s;
  return c;
}

StepCost Roofline::Decode(int64_t seqs, int64_t context) const {
  return Step({.tokens = seqs,
               .attended = seqs * context,
               .kv_read_tokens = seqs * context,
               .seqs = seqs});
}

StepCost Roofline::Prefill(int64_t tokens) const {
  return Step({.tokens = tokens,
               .attended = tokens * (tokens + 1) / 2,
               .kv_read_tokens = 0,
               .seqs = 1});
}

}  // namespace kvserve::models::sim
