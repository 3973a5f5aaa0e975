#include "models/cpu/cpu_llama_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "kvcache/kv_sizing.h"
#include "models/cpu/kv_rows.h"
#include "models/cpu/ops.h"
#include "models/cpu/paged_attention.h"
#include "models/dequant.h"
#include "models/llama_tensors.h"
#include "models/loader/model_files.h"
#include "models/quant_blocks.h"

namespace kvserve::models {
namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuLlamaModel>> CpuLlamaModel::Create(
    const ModelConfig& config, std::unique_ptr<WeightSource> weights) {
  KV_RETURN_IF_ERROR(config.Validate());
  KV_RETURN_IF_ERROR(CheckWeights(config, *weights));
  std::unique_ptr<CpuLlamaModel> model(
      new CpuLlamaModel(config, std::move(weights)));
  KV_RETURN_IF_ERROR(model->LoadWeights());
  model->TuneTilePrefetch();
  return model;
}

void CpuLlamaModel::TuneTilePrefetch() {
  std::vector<const cpu::PackedMatrix*> mats = {output_.get()};
  for (const Layer& l : layers_) {
    for (const auto* m : {&l.qkv, &l.wo, &l.gate_up, &l.down}) {
      mats.push_back(m->get());
    }
  }
  std::erase_if(mats, [](const cpu::PackedMatrix* m) {
    return m == nullptr || !m->HasSmallTiles();
  });
  if (mats.empty()) return;
  int64_t cols = 0, rows = 0;
  for (const cpu::PackedMatrix* m : mats) {
    cols = std::max(cols, m->cols());
    rows = std::max(rows, m->rows());
  }
  const std::vector<float> x(cols, 0.5f);
  std::vector<float> y(rows);
  double best[2] = {1e30, 1e30};
  constexpr cpu::TilePrefetchLevel kLevels[2] = {cpu::TilePrefetchLevel::kL1,
                                                 cpu::TilePrefetchLevel::kL2};
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 2; ++i) {
      cpu::SetSmallTilePrefetch(kLevels[i]);
      const auto t0 = std::chrono::steady_clock::now();
      for (const cpu::PackedMatrix* m : mats)
        cpu::MatMul(x.data(), 1, *m, y.data());
      best[i] = std::min(best[i], std::chrono::duration<double>(
                                      std::chrono::steady_clock::now() - t0)
                                      .count());
    }
  }
  const int pick = best[1] < best[0] ? 1 : 0;
  cpu::SetSmallTilePrefetch(kLevels[pick]);
  prefetch_note_ = absl::StrFormat(
      "small weight tiles prefetched into %s (a batch-1 pass: L1 %.2f ms, "
      "L2 %.2f ms)",
      cpu::TilePrefetchLevelName(kLevels[pick]), best[0] * 1e3, best[1] * 1e3);
}

absl::StatusOr<RawTensor> CpuLlamaModel::GetCounted(const std::string& name) {
  KV_ASSIGN_OR_RETURN(RawTensor t, weights_->Get(name));
  if (counted_.insert(name).second) {
    source_bytes_[std::string(TypeName(t.type))] +=
        static_cast<int64_t>(t.nbytes);
  }
  return t;
}

absl::StatusOr<std::vector<float>> CpuLlamaModel::LoadVector(
    const std::string& name) {
  KV_ASSIGN_OR_RETURN(RawTensor t, GetCounted(name));
  return DequantizeTensor(t);
}

// Packs the row-wise concatenation of `names` (same input width) as one
// matrix, so that e.g. Q, K and V come out of one matmul.
absl::StatusOr<std::unique_ptr<cpu::PackedMatrix>> CpuLlamaModel::PackFused(
    const std::vector<std::string>& names) {
  std::vector<RawTensor> parts;
  bool same_type = true;
  int64_t rows = 0;
  for (const std::string& n : names) {
    KV_ASSIGN_OR_RETURN(RawTensor t, GetCounted(n));
    same_type &= parts.empty() || t.type == parts[0].type;
    rows += t.shape[1];
    parts.push_back(std::move(t));
  }
  bool all_quantized = true;
  for (const RawTensor& t : parts) all_quantized &= IsDecodable(t.type);
  if (!same_type && all_quantized) {
    // A K-quant mix (e.g. Q4_K Q and K with a Q6_K V): one int8 matrix of
    // the parts as they are, never an fp32 copy.
    KV_ASSIGN_OR_RETURN(cpu::PackedMatrix m, cpu::PackQuantizedRows(parts));
    weight_bytes_ += m.bytes();
    return std::make_unique<cpu::PackedMatrix>(std::move(m));
  }
  RawTensor fused = parts[0];
  std::unique_ptr<uint8_t[]> buf;  // the concatenation, only while packing
  if (parts.size() > 1) {
    const int64_t cols = parts[0].shape[0];
    const GgmlType type = same_type ? parts[0].type : GgmlType::kF32;
    const size_t row_bytes = RowBytes(type, cols);
    buf = std::make_unique<uint8_t[]>(row_bytes * rows);
    uint8_t* dst = buf.get();
    for (const RawTensor& t : parts) {
      if (same_type) {
        std::memcpy(dst, t.data, t.nbytes);
        dst += t.nbytes;
      } else {
        KV_ASSIGN_OR_RETURN(std::vector<float> f, DequantizeTensor(t));
        std::memcpy(dst, f.data(), f.size() * sizeof(float));
        dst += f.size() * sizeof(float);
      }
    }
    fused = RawTensor{absl::StrCat(names[0], "+fused"),
                      type,
                      {cols, rows},
                      buf.get(),
                      row_bytes * rows};
  }
  // NOTE: PackMatrix keeps one kernel family for every batch size (no
  // separate prefill representation): a row's result must not depend on
  // what else is in the batch, or greedy outputs of concurrent requests
  // would differ from the same requests run alone.
  KV_ASSIGN_OR_RETURN(cpu::PackedMatrix m, cpu::PackMatrix(fused));
  weight_bytes_ += m.bytes();
  return std::make_unique<cpu::PackedMatrix>(std::move(m));
}

absl::Status CpuLlamaModel::LoadWeights() {
  const ModelConfig& c = config_;
  KV_ASSIGN_OR_RETURN(token_embd_, GetCounted("token_embd.weight"));
  KV_ASSIGN_OR_RETURN(output_norm_, LoadVector(kOutputNormTensor));
  KV_ASSIGN_OR_RETURN(output_, PackFused({c.tied_embeddings ? kTokenEmbdTensor
                                                            : kOutputTensor}));
  layers_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    Layer& layer = layers_[l];
    auto name = [l](LayerTensor t) { return LayerTensorName(l, t); };
    KV_ASSIGN_OR_RETURN(layer.attn_norm,
                        LoadVector(name(LayerTensor::kAttnNorm)));
    KV_ASSIGN_OR_RETURN(layer.ffn_norm,
                        LoadVector(name(LayerTensor::kFfnNorm)));
    if (c.qkv_bias) {
      KV_ASSIGN_OR_RETURN(layer.q_bias,
                          LoadVector(name(LayerTensor::kAttnQBias)));
      KV_ASSIGN_OR_RETURN(layer.k_bias,
                          LoadVector(name(LayerTensor::kAttnKBias)));
      KV_ASSIGN_OR_RETURN(layer.v_bias,
                          LoadVector(name(LayerTensor::kAttnVBias)));
    }
    KV_ASSIGN_OR_RETURN(layer.qkv, PackFused({name(LayerTensor::kAttnQ),
                                              name(LayerTensor::kAttnK),
                                              name(LayerTensor::kAttnV)}));
    KV_ASSIGN_OR_RETURN(layer.wo, PackFused({name(LayerTensor::kAttnOutput)}));
    KV_ASSIGN_OR_RETURN(layer.gate_up, PackFused({name(LayerTensor::kFfnGate),
                                                  name(LayerTensor::kFfnUp)}));
    KV_ASSIGN_OR_RETURN(layer.down, PackFused({name(LayerTensor::kFfnDown)}));
    // Packed copies replace the file's pages layer by layer, so the peak
    // holds one layer of both, not the whole file twice. The packed
    // matrices own their bytes; the forward reads only token_embd rows from
    // the file, which fault back in as tokens are embedded.
    weights_->DropResidentPages();
  }
  return absl::OkStatus();
}

void CpuLlamaModel::Embed(const ForwardBatch& batch) {
  const int64_t hidden = config_.hidden_size;
  const size_t row_bytes = RowBytes(token_embd_.type, hidden);
  const auto* base = static_cast<const uint8_t*>(token_embd_.data);
  ParallelFor(batch.num_tokens(), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      // Ids were validated against the vocabulary; the type was checked at
      // load, so dequantization cannot fail here.
      (void)DequantizeRow(token_embd_.type,
                          base + row_bytes * batch.token_ids[i],
                          x_.data() + i * hidden, hidden);
    }
  });
}

cpu::KvResidual& CpuLlamaModel::residual(const KvCacheView& kv) {
  std::unique_ptr<cpu::KvResidual>& r =
      residuals_[kv.k.empty() ? nullptr : kv.k[0]];
  if (r == nullptr) r = std::make_unique<cpu::KvResidual>();
  return *r;
}

void CpuLlamaModel::AttentionBlock(const Layer& layer, int layer_index,
                                   const ForwardBatch& batch,
                                   const KvCacheView& kv,
                                   cpu::KvResidual* residual) {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t q_dim = c.num_heads * d, kv_dim = c.num_kv_heads * d;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const int half = c.head_dim / 2;
  const bool sinks = !batch.sink_lens.empty();

  ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      cpu::RmsNorm(x_.data() + i * hidden, layer.attn_norm.data(), hidden,
                   c.rms_norm_eps, h_.data() + i * hidden);
    }
  });
  cpu::MatMul(h_.data(), n, *layer.qkv, qkv_.data());

  std::byte* kc = kv.k[layer_index];
  std::byte* vc = kv.v[layer_index];
  const int64_t row_bytes = kv.RowBytes();
  const kvcache::KvRotation rot =
      kvcache::KvRotationFor(kv.dtype, static_cast<int>(c.head_dim));
  // Low-bit keys are quantized a key group at a time (KvResidual).
  const bool key_groups = kvcache::KvLowBits(kv.dtype) > 0;
  ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float* q = qkv_.data() + i * qkv_dim;
      float* k = q + q_dim;
      float* v = k + kv_dim;
      if (c.qkv_bias) {
        cpu::Axpy(1.0f, layer.q_bias.data(), q, q_dim);
        cpu::Axpy(1.0f, layer.k_bias.data(), k, kv_dim);
        cpu::Axpy(1.0f, layer.v_bias.data(), v, kv_dim);
      }
      float* qs = sinks ? q_sink_.data() + i * qkv_dim : nullptr;
      if (qs != nullptr) {
        std::copy_n(q, q_dim, qs);
        rope_.Apply(qs, c.num_heads, cos_kv_.data() + i * half,
                    sin_kv_.data() + i * half);
      }
      rope_.Apply(q, c.num_heads, cos_.data() + i * half,
                  sin_.data() + i * half);
      rope_.Apply(k, c.num_kv_heads, cos_.data() + i * half,
                  sin_.data() + i * half);
      if (rot.k > 0) {
        cpu::HadamardRotate(q, q_dim, rot.k);
        if (qs != nullptr) cpu::HadamardRotate(qs, q_dim, rot.k);
        cpu::HadamardRotate(k, kv_dim, rot.k);
        cpu::HadamardRotate(v, kv_dim, rot.v);
      }
      const int64_t slot = batch.slot_mapping[i];
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const int64_t row = (slot * c.num_kv_heads + h) * row_bytes;
        if (!key_groups) {
          cpu::EncodeKvRow(kv.dtype, k + h * d, c.head_dim, kc + row);
        }
        cpu::EncodeKvRow(kv.dtype, v + h * d, c.head_dim, vc + row);
      }
    }
  });
  if (key_groups) {
    residual->WriteLayer(layer_index, qkv_.data() + q_dim,
                         qkv_.data() + q_dim + kv_dim, qkv_dim, kv);
  }

  AttentionParams ap{c.num_heads, c.num_kv_heads, c.head_dim,
                     1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                     c.sliding_window};
  PagedAttention(ap, batch, qkv_.data(), sinks ? q_sink_.data() : nullptr,
                 qkv_dim, kv, layer_index, attn_.data(),
                 block_mass_.empty() ? nullptr : block_mass_.data(), residual);
  if (rot.v > 0) {  // the output is a sum of rotated V rows: rotate it back
    ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
      cpu::HadamardRotate(attn_.data() + lo * q_dim, (hi - lo) * q_dim, rot.v);
    });
  }
  // Output projection into h_, then the residual add.
  cpu::MatMul(attn_.data(), n, *layer.wo, h_.data());
  ParallelFor(n * hidden, 1024, [&](int64_t lo, int64_t hi) {
    cpu::Axpy(1.0f, h_.data() + lo, x_.data() + lo, hi - lo);
  });
}

void CpuLlamaModel::MlpBlock(const Layer& layer, int64_t n) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      cpu::RmsNorm(x_.data() + i * hidden, layer.ffn_norm.data(), hidden,
                   c.rms_norm_eps, h_.data() + i * hidden);
    }
  });
  cpu::MatMul(h_.data(), n, *layer.gate_up, gate_up_.data());
  ParallelFor(n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float* g = gate_up_.data() + i * 2 * inter;
      cpu::SiluMul(g, g + inter, inter, act_.data() + i * inter);
    }
  });
  cpu::MatMul(act_.data(), n, *layer.down, h_.data());
  ParallelFor(n * hidden, 1024, [&](int64_t lo, int64_t hi) {
    cpu::Axpy(1.0f, h_.data() + lo, x_.data() + lo, hi - lo);
  });
}

absl::Status CpuLlamaModel::Forward(const ForwardBatch& batch,
                                    const KvCacheView& kv,
                                    std::vector<float>* logits) {
  const ModelConfig& c = config_;
  if (kv.k.size() != static_cast<size_t>(c.num_layers) ||
      kv.v.size() != static_cast<size_t>(c.num_layers) ||
      kv.num_kv_heads != c.num_kv_heads || kv.head_dim != c.head_dim) {
    return absl::InvalidArgumentError(
        "KV cache view does not match the model's layers, KV heads or "
        "head_dim");
  }
  if (kv.dtype == kvcache::KvDtype::kFP8) {
    return absl::InvalidArgumentError(
        "KV cache view: fp8 KV has no CPU format");
  }
  KV_RETURN_IF_ERROR(kvcache::CheckKvDtypeShape(kv.dtype, c.head_dim));
  KV_RETURN_IF_ERROR(
      batch.Validate(kv.num_blocks, kv.block_size, c.vocab_size));
  const int64_t n = batch.num_tokens();
  const int64_t hidden = c.hidden_size, d = c.head_dim;
  const int64_t qkv_dim = (c.num_heads + 2 * c.num_kv_heads) * d;
  Grow(x_, n * hidden);
  Grow(h_, n * hidden);
  Grow(qkv_, n * qkv_dim);
  Grow(attn_, n * c.num_heads * d);
  Grow(gate_up_, n * 2 * c.intermediate_size);
  Grow(act_, n * c.intermediate_size);
  Grow(cos_, n * d / 2);
  Grow(sin_, n * d / 2);

  Embed(batch);
  rope_.Tables(batch.RopePositions(), n, cos_.data(), sin_.data());
  block_mass_.clear();
  if (!batch.mass_seqs.empty()) {
    block_mass_.assign(
        static_cast<size_t>(batch.num_seqs()) * batch.max_blocks_per_seq, 0.0f);
  }
  if (!batch.sink_lens.empty()) {
    Grow(q_sink_, n * qkv_dim);
    Grow(cos_kv_, n * d / 2);
    Grow(sin_kv_, n * d / 2);
    rope_.Tables(batch.positions.data(), n, cos_kv_.data(), sin_kv_.data());
  }
  cpu::KvResidual* residual = nullptr;
  if (kvcache::KvLowBits(kv.dtype) > 0) {
    KV_RETURN_IF_ERROR(kvcache::CheckKvDtypeBlockSize(kv.dtype, kv.block_size));
    residual = &this->residual(kv);
    residual->Plan(batch, kv);
  }
  for (int l = 0; l < c.num_layers; ++l) {
    AttentionBlock(layers_[l], l, batch, kv, residual);
    MlpBlock(layers_[l], n);
  }
  if (residual != nullptr) residual->Commit();

  // Final norm only for the rows whose logits are wanted.
  const int64_t rows = static_cast<int64_t>(batch.logits_rows.size());
  for (int64_t r = 0; r < rows; ++r) {
    cpu::RmsNorm(x_.data() + batch.logits_rows[r] * hidden, output_norm_.data(),
                 hidden, c.rms_norm_eps, h_.data() + r * hidden);
  }
  logits->resize(rows * c.vocab_size);
  cpu::MatMul(h_.data(), rows, *output_, logits->data());
  return absl::OkStatus();
}

}  // namespace kvserve::models
