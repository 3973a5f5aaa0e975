#include "models/cuda/cuda_llama.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kvcache/kv_sizing.h"
#include "models/dequant.h"
#include "models/llama_tensors.h"
#include "models/loader/model_files.h"
#include "models/rope.h"

namespace kvserve::models::cuda {
namespace {

// fp32 -> bf16, round to nearest even (NaN stays NaN).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

int64_t Align(int64_t n) { return (n + 255) / 256 * 256; }

}  // namespace

CudaLlamaModel::~CudaLlamaModel() {
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::Status CudaLlamaModel::Init() {
  const ModelConfig& c = config_;
  KV_RETURN_IF_ERROR(c.Validate());
  if (c.head_dim != 64 && c.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=cuda: head_dim ", c.head_dim,
        " is not supported by the CUDA attention kernels (64 or 128)"));
  }
  if (c.GroupSize() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=cuda: num_heads / num_kv_heads = ", c.GroupSize(),
        " exceeds the CUDA attention limit of 64"));
  }
  int dev = 0;
  KV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&dev));
  KV_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, dev));
  KV_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  KV_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  KV_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_, stream_));
  KV_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  Rope rope(c);
  KV_RETURN_IF_ERROR(inv_freq_.Allocate(c.head_dim / 2 * 4, "rope inv_freq"));
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(inv_freq_.as<float>(), rope.inv_freq().data(),
                 c.head_dim / 2 * sizeof(float), cudaMemcpyHostToDevice));
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());  // see Upload()
  AttnShape shape;
  shape.head_dim = c.head_dim;
  KV_RETURN_IF_ERROR(attn_scratch_.Allocate(
      AttnScratchFloats(shape, num_sms_, attn_tuning_) * 4,
      "attention split-K scratch"));
  return AllocateWeights();
}

absl::Status CudaLlamaModel::AllocateWeights() {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t qkv_dim = q_dim + 2LL * c.num_kv_heads * c.head_dim;
  auto alloc = [&](DeviceBuffer& b, int64_t bytes, const char* what) {
    weight_bytes_ += bytes;
    return b.Allocate(bytes, what);
  };
  KV_RETURN_IF_ERROR(alloc(embd_, c.vocab_size * hidden * 2, "token_embd"));
  if (!c.tied_embeddings) {
    KV_RETURN_IF_ERROR(alloc(output_, c.vocab_size * hidden * 2, "output"));
  }
  KV_RETURN_IF_ERROR(alloc(output_norm_, hidden * 4, "output_norm"));
  layers_.resize(c.num_layers);
  for (Layer& l : layers_) {
    KV_RETURN_IF_ERROR(alloc(l.attn_norm, hidden * 4, "attn_norm"));
    KV_RETURN_IF_ERROR(alloc(l.ffn_norm, hidden * 4, "ffn_norm"));
    if (c.qkv_bias) KV_RETURN_IF_ERROR(alloc(l.bias, qkv_dim * 4, "qkv bias"));
    KV_RETURN_IF_ERROR(alloc(l.qkv, qkv_dim * hidden * 2, "attn_qkv"));
    KV_RETURN_IF_ERROR(alloc(l.wo, hidden * q_dim * 2, "attn_output"));
    KV_RETURN_IF_ERROR(alloc(l.gate_up, 2 * inter * hidden * 2, "ffn_gate_up"));
    KV_RETURN_IF_ERROR(alloc(l.down, hidden * inter * 2, "ffn_down"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::Create(
    const ModelConfig& config, const WeightSource& weights,
    const AttnTuning& tuning) {
  KV_RETURN_IF_ERROR(CheckWeights(config, weights));
  std::unique_ptr<CudaLlamaModel> m(new CudaLlamaModel(config));
  m->attn_tuning_ = tuning;
  KV_RETURN_IF_ERROR(m->Init());
  KV_RETURN_IF_ERROR(m->Upload(weights));
  return m;
}

absl::StatusOr<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::CreateRandom(
    const ModelConfig& config, uint64_t seed) {
  std::unique_ptr<CudaLlamaModel> m(new CudaLlamaModel(config));
  KV_RETURN_IF_ERROR(m->Init());
  KV_RETURN_IF_ERROR(m->Randomize(seed));
  return m;
}

// Dequantizes each named tensor (ggml [in, out] = row-major [out][in]) to
// fp32 on the host, converts to bf16 and copies the row-wise concatenation
// into `dst`; norms and biases (`as_f32`) stay fp32.
static absl::Status UploadTensors(const WeightSource& w,
                                  const std::vector<std::string>& names,
                                  bool as_f32, DeviceBuffer& dst) {
  int64_t offset = 0;
  std::vector<uint16_t> half;
  for (const std::string& name : names) {
    KV_ASSIGN_OR_RETURN(RawTensor t, w.Get(name));
    KV_ASSIGN_OR_RETURN(std::vector<float> f, DequantizeTensor(t));
    const int64_t bytes = static_cast<int64_t>(f.size()) * (as_f32 ? 4 : 2);
    if (offset + bytes > dst.bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " in ", w.origin(), ": ", f.size(),
                       " values do not fit the model's shape"));
    }
    const void* src = f.data();
    if (!as_f32) {
      half.resize(f.size());
      for (size_t i = 0; i < f.size(); ++i) half[i] = ToBf16(f[i]);
      src = half.data();
    }
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst.as<uint8_t>() + offset, src, bytes,
                                       cudaMemcpyHostToDevice));
    offset += bytes;
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::Upload(const WeightSource& w) {
  const ModelConfig& c = config_;
  KV_RETURN_IF_ERROR(UploadTensors(w, {kTokenEmbdTensor}, false, embd_));
  if (!c.tied_embeddings) {
    KV_RETURN_IF_ERROR(UploadTensors(w, {kOutputTensor}, false, output_));
  }
  KV_RETURN_IF_ERROR(UploadTensors(w, {kOutputNormTensor}, true, output_norm_));
  for (int i = 0; i < c.num_layers; ++i) {
    Layer& l = layers_[i];
    auto name = [i](LayerTensor t) { return LayerTensorName(i, t); };
    KV_RETURN_IF_ERROR(
        UploadTensors(w, {name(LayerTensor::kAttnNorm)}, true, l.attn_norm));
    KV_RETURN_IF_ERROR(
        UploadTensors(w, {name(LayerTensor::kFfnNorm)}, true, l.ffn_norm));
    if (c.qkv_bias) {
      KV_RETURN_IF_ERROR(UploadTensors(
          w,
          {name(LayerTensor::kAttnQBias), name(LayerTensor::kAttnKBias),
           name(LayerTensor::kAttnVBias)},
          true, l.bias));
    }
    KV_RETURN_IF_ERROR(
        UploadTensors(w,
                      {name(LayerTensor::kAttnQ), name(LayerTensor::kAttnK),
                       name(LayerTensor::kAttnV)},
                      false, l.qkv));
    KV_RETURN_IF_ERROR(
        UploadTensors(w, {name(LayerTensor::kAttnOutput)}, false, l.wo));
    KV_RETURN_IF_ERROR(UploadTensors(
        w, {name(LayerTensor::kFfnGate), name(LayerTensor::kFfnUp)}, false,
        l.gate_up));
    KV_RETURN_IF_ERROR(
        UploadTensors(w, {name(LayerTensor::kFfnDown)}, false, l.down));
  }
  // A cudaMemcpy from pageable memory may return before its DMA lands, and
  // stream_ (non-blocking) does not wait for the legacy stream: finish the
  // uploads before any kernel reads them.
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::Randomize(uint64_t seed) {
  const ModelConfig& c = config_;
  const float s_hidden = 1.0f / std::sqrt(static_cast<float>(c.hidden_size));
  auto fill = [&](DeviceBuffer& b, float scale) -> absl::Status {
    KV_CUDA_RETURN_IF_ERROR(
        FillRandomBf16(b.as<bf16>(), b.bytes() / 2, seed++, scale, stream_));
    return absl::OkStatus();
  };
  auto ones = [&](DeviceBuffer& b) -> absl::Status {
    KV_CUDA_RETURN_IF_ERROR(
        FillF32(b.as<float>(), b.bytes() / 4, 1.0f, stream_));
    return absl::OkStatus();
  };
  KV_RETURN_IF_ERROR(fill(embd_, 1.0f));
  if (!c.tied_embeddings) KV_RETURN_IF_ERROR(fill(output_, s_hidden));
  KV_RETURN_IF_ERROR(ones(output_norm_));
  for (Layer& l : layers_) {
    KV_RETURN_IF_ERROR(ones(l.attn_norm));
    KV_RETURN_IF_ERROR(ones(l.ffn_norm));
    if (c.qkv_bias) {
      KV_CUDA_RETURN_IF_ERROR(
          FillF32(l.bias.as<float>(), l.bias.bytes() / 4, 0.0f, stream_));
    }
    KV_RETURN_IF_ERROR(fill(l.qkv, s_hidden));
    KV_RETURN_IF_ERROR(fill(
        l.wo, 1.0f / std::sqrt(static_cast<float>(c.num_heads * c.head_dim))));
    KV_RETURN_IF_ERROR(fill(l.gate_up, s_hidden));
    KV_RETURN_IF_ERROR(fill(
        l.down, 1.0f / std::sqrt(static_cast<float>(c.intermediate_size))));
  }
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::Reserve(int64_t tokens, int64_t logits_rows) {
  const ModelConfig& c = config_;
  tokens = std::max<int64_t>(tokens, 1);
  logits_rows = std::max<int64_t>(logits_rows, 1);
  if (tokens > cap_tokens_) {
    const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
    const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
    const int64_t qkv_dim = q_dim + 2LL * c.num_kv_heads * c.head_dim;
    KV_RETURN_IF_ERROR(x_.Allocate(tokens * hidden * 4, "x"));
    KV_RETURN_IF_ERROR(h_.Allocate(tokens * hidden * 2, "h"));
    KV_RETURN_IF_ERROR(qkv_buf_.Allocate(tokens * qkv_dim * 4, "qkv"));
    KV_RETURN_IF_ERROR(attn_.Allocate(tokens * q_dim * 2, "attn"));
    KV_RETURN_IF_ERROR(delta_.Allocate(tokens * hidden * 4, "delta"));
    KV_RETURN_IF_ERROR(gu_.Allocate(tokens * 2 * inter * 4, "gate_up"));
    KV_RETURN_IF_ERROR(act_.Allocate(tokens * inter * 2, "act"));
    cap_tokens_ = tokens;
  }
  if (logits_rows > cap_rows_) {
    KV_RETURN_IF_ERROR(hf_.Allocate(logits_rows * c.hidden_size * 2, "hf"));
    KV_RETURN_IF_ERROR(
        logits_.Allocate(logits_rows * c.vocab_size * 4, "logits"));
    KV_RETURN_IF_ERROR(argmax_.Allocate(logits_rows * 4, "argmax"));
    KV_RETURN_IF_ERROR(
        logits_host_.Allocate(logits_rows * c.vocab_size * 4, "logits (host)"));
    KV_RETURN_IF_ERROR(argmax_host_.Allocate(logits_rows * 4, "argmax (host)"));
    cap_rows_ = logits_rows;
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::Gemm(const DeviceBuffer& w, int64_t out,
                                  int64_t in, const bf16* x, int64_t n,
                                  float* y) {
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major y[n][out] = x[n][in] W[out][in]^T is, column-major,
  // y (out x n) = W^T (out x in, W stored in x out) * x (in x n).
  KV_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
      static_cast<int>(n), static_cast<int>(in), &alpha, w.as<bf16>(),
      CUDA_R_16BF, static_cast<int>(in), x, CUDA_R_16BF, static_cast<int>(in),
      &beta, y, CUDA_R_32F, static_cast<int>(out), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

// One H2D copy per step: token ids, positions, slots, block tables, logits
// rows and attention work items, packed in pinned memory.
absl::Status CudaLlamaModel::UploadMeta(const ForwardBatch& batch,
                                        const AttnPlan& plan) {
  const int64_t t = batch.num_tokens();
  const int64_t sizes[] = {
      t * 4,
      t * 4,
      t * 4,
      static_cast<int64_t>(batch.num_seqs()) * batch.max_blocks_per_seq * 4,
      static_cast<int64_t>(batch.logits_rows.size()) * 4,
      static_cast<int64_t>(plan.small.size() * sizeof(AttnWorkItem)),
      static_cast<int64_t>(plan.tiles.size() * sizeof(AttnWorkItem))};
  // Positions feed RoPE only: attention walks context_lens.
  const void* srcs[] = {batch.token_ids.data(),    batch.RopePositions(),
                        batch.slot_mapping.data(), batch.block_tables.data(),
                        batch.logits_rows.data(),  plan.small.data(),
                        plan.tiles.data()};
  int64_t offsets[7];
  int64_t total = 0;
  for (int i = 0; i < 7; ++i) {
    offsets[i] = total;
    total += Align(sizes[i]);
  }
  if (total > meta_host_.bytes()) {
    KV_RETURN_IF_ERROR(meta_host_.Allocate(total * 2, "step metadata (host)"));
  }
  KV_RETURN_IF_ERROR(meta_.Reserve(meta_host_.bytes(), "step metadata"));
  auto* host = meta_host_.as<uint8_t>();
  for (int i = 0; i < 7; ++i) {
    if (sizes[i] > 0) std::memcpy(host + offsets[i], srcs[i], sizes[i]);
  }
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(meta_.as<uint8_t>(), host, total,
                                          cudaMemcpyHostToDevice, stream_));
  auto at = [&](int i) { return meta_.as<uint8_t>() + offsets[i]; };
  d_tokens_ = reinterpret_cast<const int32_t*>(at(0));
  d_positions_ = reinterpret_cast<const int32_t*>(at(1));
  d_slots_ = reinterpret_cast<const int32_t*>(at(2));
  d_tables_ = reinterpret_cast<const int32_t*>(at(3));
  d_logit_rows_ = reinterpret_cast<const int32_t*>(at(4));
  d_small_ = reinterpret_cast<const AttnWorkItem*>(at(5));
  d_tiles_ = reinterpret_cast<const AttnWorkItem*>(at(6));
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::RunLayers(const ForwardBatch& batch,
                                       const CudaKvCache& kv,
                                       const AttnPlan& plan) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t qkv_dim = q_dim + 2LL * c.num_kv_heads * c.head_dim;
  float* x = x_.as<float>();
  bf16* h = h_.as<bf16>();
  float* qkv = qkv_buf_.as<float>();
  float* delta = delta_.as<float>();
  AttnShape shape{c.num_heads,
                  c.num_kv_heads,
                  c.head_dim,
                  kv.block_size,
                  batch.max_blocks_per_seq,
                  c.sliding_window,
                  1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                  kv.elem};
  // int8 pages hold K and V Hadamard-rotated (as the CPU's do).
  const kvcache::KvRotation rot =
      kvcache::KvRotationFor(kv.elem == KvElem::kInt8 ? kvcache::KvDtype::kInt8
                                                      : kvcache::KvDtype::kBF16,
                             c.head_dim);
  KV_CUDA_RETURN_IF_ERROR(
      EmbeddingGather(embd_.as<bf16>(), d_tokens_, n, hidden, x, stream_));
  for (int l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[l];
    // h = RmsNorm(x += delta of the previous layer's MLP).
    KV_CUDA_RETURN_IF_ERROR(AddRmsNorm(x, l == 0 ? nullptr : delta,
                                       L.attn_norm.as<float>(), n, hidden,
                                       c.rms_norm_eps, nullptr, h, stream_));
    KV_RETURN_IF_ERROR(Gemm(L.qkv, qkv_dim, hidden, h, n, qkv));
    KV_CUDA_RETURN_IF_ERROR(QkvRopeCache(
        qkv, n, qkv_dim, c.num_heads, c.num_kv_heads, c.head_dim,
        c.rope_style == RopeStyle::kInterleaved, inv_freq_.as<float>(),
        c.qkv_bias ? L.bias.as<float>() : nullptr, d_positions_, d_slots_,
        kv.elem, kv.block_size, rot.k, rot.v, kv.k(l), kv.v(l), stream_));
    KV_CUDA_RETURN_IF_ERROR(PagedAttention(
        shape, plan, d_small_, d_tiles_, qkv, qkv_dim, kv.k(l), kv.v(l),
        d_tables_, attn_scratch_.as<float>(), attn_.as<bf16>(), stream_));
    if (rot.v > 0) {
      KV_CUDA_RETURN_IF_ERROR(
          HadamardRows(attn_.as<bf16>(), n, q_dim, rot.v, stream_));
    }
    KV_RETURN_IF_ERROR(Gemm(L.wo, hidden, q_dim, attn_.as<bf16>(), n, delta));
    KV_CUDA_RETURN_IF_ERROR(AddRmsNorm(x, delta, L.ffn_norm.as<float>(), n,
                                       hidden, c.rms_norm_eps, nullptr, h,
                                       stream_));
    KV_RETURN_IF_ERROR(
        Gemm(L.gate_up, 2 * inter, hidden, h, n, gu_.as<float>()));
    KV_CUDA_RETURN_IF_ERROR(
        SiluMul(gu_.as<float>(), n, inter, act_.as<bf16>(), stream_));
    KV_RETURN_IF_ERROR(Gemm(L.down, hidden, inter, act_.as<bf16>(), n, delta));
  }
  // Final residual add and norm for the wanted rows only, then the head.
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  if (rows == 0) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(AddRmsNorm(x, delta, output_norm_.as<float>(), rows,
                                     hidden, c.rms_norm_eps, d_logit_rows_,
                                     hf_.as<bf16>(), stream_));
  KV_RETURN_IF_ERROR(Gemm(c.tied_embeddings ? embd_ : output_, c.vocab_size,
                          hidden, hf_.as<bf16>(), rows, logits_.as<float>()));
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::CopyOutputs(const ForwardBatch& batch,
                                         ForwardOutput* out) {
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  const int64_t vocab = config_.vocab_size;
  out->logits = absl::MakeSpan(logits_host_.as<float>(), rows * vocab);
  if (rows == 0) return absl::OkStatus();
  KV_CUDA_RETURN_IF_ERROR(ArgmaxRows(logits_.as<float>(), rows, vocab,
                                     argmax_.as<int32_t>(), stream_));
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(argmax_host_.as<int32_t>(),
                                          argmax_.as<int32_t>(), rows * 4,
                                          cudaMemcpyDeviceToHost, stream_));
  auto whole = [&](int64_t r) {
    return batch.argmax_only.empty() || batch.argmax_only[r] == 0;
  };
  for (int64_t r = 0; r < rows;) {
    if (!whole(r)) {
      ++r;
      continue;
    }
    int64_t end = r + 1;
    while (end < rows && whole(end)) ++end;
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        out->logits.data() + r * vocab, logits_.as<float>() + r * vocab,
        (end - r) * vocab * 4, cudaMemcpyDeviceToHost, stream_));
    r = end;
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModel::Forward(const ForwardBatch& batch,
                                     const CudaKvCache& kv,
                                     ForwardOutput* out) {
  const ModelConfig& c = config_;
  KV_RETURN_IF_ERROR(
      batch.Validate(kv.num_blocks, kv.block_size, c.vocab_size));
  if (batch.num_tokens() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward batch: ", batch.num_tokens(),
                     " tokens exceed the CUDA step limit of 65535"));
  }
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    if (batch.SinkLen(s) > 0) {  // the engine refuses such a policy first
      return absl::UnimplementedError(
          "forward batch: the CUDA attention does not score sinks at their "
          "in-cache positions (sink_lens)");
    }
  }
  const AttnShape shape{
      c.num_heads,   c.num_kv_heads,           c.head_dim,
      kv.block_size, batch.max_blocks_per_seq, c.sliding_window};
  const AttnPlan plan =
      PlanAttention(shape, batch.seq_starts.data(), batch.context_lens.data(),
                    batch.num_seqs(), num_sms_, attn_tuning_);
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  KV_RETURN_IF_ERROR(Reserve(batch.num_tokens(), rows));
  KV_RETURN_IF_ERROR(UploadMeta(batch, plan));
  KV_RETURN_IF_ERROR(RunLayers(batch, kv, plan));
  KV_RETURN_IF_ERROR(CopyOutputs(batch, out));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  const int32_t* argmax = argmax_host_.as<int32_t>();
  out->argmax.assign(argmax, argmax + rows);
  return absl::OkStatus();
}

}  // namespace kvserve::models::cuda
