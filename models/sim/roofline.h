// The roofline cost of one forward step of a Llama-style model on a GPU
// (gpu_specs.h), per tensor-parallel rank: the step reads every weight once
// and the K/V of the tokens it attends to from device memory, does the
// matrix products of its tokens and their attention, and (tp > 1) two
// all-reduces of its activations per layer. Its time is the larger of
// reading and computing (each at a stated fraction of the datasheet rate)
// plus the all-reduces and the host's work per sequence. It is what `kvserve
// plan --gpu` reports and the simulated device's step time.
#pragma once

#include <cstdint>

#include "models/forward_batch.h"
#include "models/model_config.h"
#include "models/sim/gpu_specs.h"

namespace kvserve::models::sim {

// Fractions of the datasheet rates a serving forward reaches, and the host's
// time per sequence of a step. A streaming copy on an H200 moves ~0.9 of its
// 4.8 TB/s and a large bf16 GEMM reaches ~0.8 of its peak; a forward's
// smaller, mixed kernels less. The host's share (scheduling, sampling, stop
// checks and streaming, per sequence, not overlapped with the forward) is
// what weighs in short steps of many sequences. The defaults are the triple
// that best reproduces TensorRT-LLM's published H100 throughput
// (tools/sim_fidelity.py; its H200 figures, held out, check them:
// docs/PERFORMANCE.md).
struct Efficiency {
  double memory = 0.75;
  double flops = 0.5;
  double link = 0.7;
  double link_latency_s = 10e-6;  // per all-reduce
  double host_s_per_seq = 4e-6;
};

// The units attention's matrix products run on. kFp8 only counts where the
// weights are fp8 too (an fp8 model's activations, Q included, are fp8) and
// the GPU has an fp8 rate: Hopper's FP8 context attention, which
// TensorRT-LLM runs for an fp8 checkpoint with an fp8 KV cache.
enum class AttentionUnits { kBf16, kFp8 };

// One step's work (models/forward_batch.h: a batch's counts).
using StepLoad = BatchLoad;

struct StepCost {
  double weights_s = 0;    // reading the rank's weights
  double kv_s = 0;         // reading (and writing) K/V
  double compute_s = 0;    // matrix products and attention
  double allreduce_s = 0;  // tensor-parallel all-reduces
  double host_s = 0;       // the host's per-sequence work
  double total_s = 0;      // max(weights + kv, compute) + allreduce + host
  bool compute_bound = false;
};

class Roofline {
 public:
  // weight_bytes: per parameter (2 bf16, 1 fp8: fp8 weights use the fp8
  // rate where the GPU has one); kv_bytes_per_token: per rank, all layers.
  Roofline(const ModelConfig& config, const GpuSpec& gpu, int tp,
           double weight_bytes, int64_t kv_bytes_per_token, Efficiency eff = {},
           AttentionUnits attention = AttentionUnits::kBf16);

  [[nodiscard]] StepCost Step(const StepLoad& load) const;
  // A decode step of `seqs` sequences of `context` tokens each.
  [[nodiscard]] StepCost Decode(int64_t seqs, int64_t context) const;
  // One prompt of `tokens` prefilled in one step (causal attention).
  [[nodiscard]] StepCost Prefill(int64_t tokens) const;

  // Parameters of the matrix products (attention, MLP, LM head; not the
  // embedding table, which a step gathers rows of).
  [[nodiscard]] int64_t MatmulParams() const { return matmul_params_; }
  [[nodiscard]] double PeakFlops() const { return peak_flops_; }

 private:
  ModelConfig config_;
  GpuSpec gpu_;
  int tp_;
  double weight_bytes_;
  int64_t kv_bytes_per_token_;
  Efficiency eff_;
  int64_t matmul_params_;
  double peak_flops_;
  double attention_flops_;  // the rate of attention's products
};

}  // namespace kvserve::models::sim
