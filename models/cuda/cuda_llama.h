// The Llama-family forward pass on one CUDA device: owns the bf16 weights in
// device memory (GGUF / safetensors weights dequantized at load), the
// activation workspace, a cuBLAS handle and a stream. Reads and writes the
// paged KV cache through a CudaKvCache it does not own (the backend's).
//
// Numerics: residual stream fp32; GEMM inputs bf16, cuBLAS GEMMs with fp32
// accumulation and fp32 outputs; attention in fp32 over bf16 K/V; logits
// fp32. Same semantics as models::CpuLlamaModel (RoPE style, GQA, qkv bias,
// sliding window, tied head). Not thread-safe: one (engine) thread calls it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/cuda/cuda_status.h"
#include "models/cuda/kernels.h"
#include "models/forward_batch.h"
#include "models/model_config.h"
#include "models/weights.h"

namespace kvserve::models::cuda {

// Device KV storage, non-owning: 2 * num_layers planes of plane_bytes each
// (plane 2l: K of layer l, 2l + 1: V), each plane laid out
// [num_blocks][block_size][num_kv_heads][head_dim] in `elem` (int8: each
// block's values followed by its scales, models/cuda/int8_kv.cuh).
struct CudaKvCache {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  void* base = nullptr;
  int64_t plane_bytes = 0;
  KvElem elem = KvElem::kBf16;

  void* k(int layer) const { return Plane(2 * layer); }
  void* v(int layer) const { return Plane(2 * layer + 1); }
  void* Plane(int p) const {
    return static_cast<unsigned char*>(base) + p * plane_bytes;
  }
};

class CudaLlamaModel {
 public:
  // Uploads every weight the forward needs from `weights` (read only during
  // the call). Errors name the tensor (missing, bad shape or type) or the
  // CUDA call; head_dim must be 64 or 128 and num_heads / num_kv_heads <= 64.
  // `tuning`: the attention's split-K and decode-kernel choices.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CudaLlamaModel>> Create(
      const ModelConfig& config, const WeightSource& weights,
      const AttnTuning& tuning = {});
  // Random bf16 weights (uniform, 1/sqrt(fan-in) scale) of `config`'s shape:
  // benchmarks at real model shapes without files.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CudaLlamaModel>>
  CreateRandom(const ModelConfig& config, uint64_t seed);
  ~CudaLlamaModel();

  const ModelConfig& config() const { return config_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  cudaStream_t stream() const { return stream_; }
  int num_sms() const { return num_sms_; }
  // Elements of one KV block in one plane (block_size * kv_heads * head_dim).
  int64_t BlockElems(int32_t block_size) const {
    return static_cast<int64_t>(block_size) * config_.num_kv_heads *
           config_.head_dim;
  }
  // Bytes of one KV block in one plane (int8: values and scales).
  int64_t BlockBytes(int32_t block_size, KvElem elem) const {
    return KvBlockBytes(elem, block_size, config_.num_kv_heads,
                        config_.head_dim);
  }

  // Grows the workspace for steps of up to `tokens` tokens, `seqs`
  // sequences and `logits_rows` logits rows (Forward also grows on demand).
  [[nodiscard]] absl::Status Reserve(int64_t tokens, int64_t logits_rows);

  // Runs one step: writes the batch's K/V into `kv` at slot_mapping and
  // returns each logits row's argmax (reduced on the device) and logits
  // [batch.logits_rows.size(), vocab] in pinned host memory this model owns
  // (valid until its next Forward), copied for the rows not flagged
  // argmax_only. Validates the batch (InvalidArgument); CUDA failures are
  // Internal / ResourceExhausted naming the call. Synchronizes the stream.
  [[nodiscard]] absl::Status Forward(const ForwardBatch& batch,
                                     const CudaKvCache& kv, ForwardOutput* out);

 private:
  struct Layer {
    DeviceBuffer attn_norm, ffn_norm;  // fp32 [hidden]
    DeviceBuffer bias;                 // fp32 [qkv_dim] or empty
    DeviceBuffer qkv;                  // bf16 [qkv_dim][hidden]
    DeviceBuffer wo;                   // bf16 [hidden][H * D]
    DeviceBuffer gate_up;              // bf16 [2 * inter][hidden]
    DeviceBuffer down;                 // bf16 [hidden][inter]
  };

  explicit CudaLlamaModel(const ModelConfig& config) : config_(config) {}
  [[nodiscard]] absl::Status Init();
  [[nodiscard]] absl::Status Upload(const WeightSource& w);
  [[nodiscard]] absl::Status Randomize(uint64_t seed);
  [[nodiscard]] absl::Status AllocateWeights();
  // y[n, out] = x[n, in] * W[out, in]^T (bf16 in, fp32 out).
  [[nodiscard]] absl::Status Gemm(const DeviceBuffer& w, int64_t out,
                                  int64_t in, const bf16* x, int64_t n,
                                  float* y);
  [[nodiscard]] absl::Status UploadMeta(const ForwardBatch& batch,
                                        const AttnPlan& plan);
  [[nodiscard]] absl::Status RunLayers(const ForwardBatch& batch,
                                       const CudaKvCache& kv,
                                       const AttnPlan& plan);
  // Enqueues the argmax of every logits row, then the rows not flagged
  // argmax_only, to the pinned host buffers (one copy per run of consecutive
  // such rows); points out->logits at them.
  [[nodiscard]] absl::Status CopyOutputs(const ForwardBatch& batch,
                                         ForwardOutput* out);

  ModelConfig config_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  int num_sms_ = 1;
  // Split-K and decode-kernel choices (Create's `tuning`; mma_decode, the
  // tensor-core decode kernel, stays experimental until measured).
  AttnTuning attn_tuning_;
  int64_t weight_bytes_ = 0;

  DeviceBuffer embd_;         // bf16 [vocab][hidden]
  DeviceBuffer output_;       // bf16 [vocab][hidden]; empty when tied
  DeviceBuffer output_norm_;  // fp32 [hidden]
  DeviceBuffer inv_freq_;     // fp32 [head_dim / 2]
  std::vector<Layer> layers_;

  // Workspace, grown on demand.
  int64_t cap_tokens_ = 0, cap_rows_ = 0;
  DeviceBuffer x_, h_, qkv_buf_, attn_, delta_, gu_, act_, hf_, logits_;
  DeviceBuffer argmax_;  // int32 [cap_rows_]
  // What each step returns, in pinned memory: fp32 [cap_rows_][vocab] (the
  // memory ForwardOutput::logits points to) and int32 [cap_rows_].
  PinnedBuffer logits_host_, argmax_host_;
  DeviceBuffer attn_scratch_, meta_;
  PinnedBuffer meta_host_;  // staging for the step's metadata
  // Device pointers into meta_ for the current step.
  const int32_t* d_tokens_ = nullptr;
  const int32_t* d_positions_ = nullptr;
  const int32_t* d_slots_ = nullptr;
  const int32_t* d_tables_ = nullptr;
  const int32_t* d_logit_rows_ = nullptr;
  const AttnWorkItem* d_small_ = nullptr;
  const AttnWorkItem* d_tiles_ = nullptr;
};

}  // namespace kvserve::models::cuda
