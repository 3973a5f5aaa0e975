// The Llama-family forward pass on the CPU (Llama 2/3, Mistral, Qwen2,
// SmolLM2): owns the packed weights and scratch buffers; reads and writes
// K/V through a KvCacheView it does not own. One flattened batch per call
// (prefill chunks and decode tokens mixed). Not thread-safe: the engine
// thread alone calls Forward; kernels inside parallelize across cores.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "models/cpu/kv_residual.h"
#include "models/cpu/matmul.h"
#include "models/forward_batch.h"
#include "models/kv_view.h"
#include "models/model_config.h"
#include "models/rope.h"
#include "models/weights.h"

namespace kvserve::models {

class CpuLlamaModel {
 public:
  // Packs every weight the forward needs from `weights`, which it keeps
  // alive (token embeddings are read from it in place) with its resident
  // pages dropped after packing. Fails with a Status
  // naming the tensor when one is missing or has the wrong shape or type.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CpuLlamaModel>> Create(
      const ModelConfig& config, std::unique_ptr<WeightSource> weights);

  const ModelConfig& config() const { return config_; }
  // Bytes of packed weights held (including both kernel representations).
  size_t weight_bytes() const { return weight_bytes_; }
  // How Create chose SetSmallTilePrefetch's level ("" when no matrix has
  // small tiles): both levels' best time of one decode pass over the
  // weights, for the start log.
  const std::string& tile_prefetch_note() const { return prefetch_note_; }
  // Bytes of the source tensors the forward reads, by ggml type name (each
  // tensor once): what the file holds, beside weight_bytes().
  const std::map<std::string, int64_t>& source_bytes_by_type() const {
    return source_bytes_;
  }

  // Runs one step: writes the batch's K/V into `kv` at slot_mapping and
  // returns logits [batch.logits_rows.size(), vocab] row-major in `logits`.
  [[nodiscard]] absl::Status Forward(const ForwardBatch& batch,
                                     const KvCacheView& kv,
                                     std::vector<float>* logits);
  // After a Forward of a batch with mass_seqs: ForwardOutput::block_mass
  // (empty otherwise), valid until the next Forward.
  const std::vector<float>& block_mass() const { return block_mass_; }
  // The full-precision rows of the int3/int2 key groups being filled in the
  // KV pool `kv` views (one stage per pool, keyed by its first K plane); the
  // backend tells it when it copies or replaces a block's pages.
  cpu::KvResidual& residual(const KvCacheView& kv);

 private:
  struct Layer {
    std::vector<float> attn_norm, ffn_norm;
    std::vector<float> q_bias, k_bias, v_bias;  // empty without qkv bias
    std::unique_ptr<cpu::PackedMatrix>
        qkv;  // rows: q (H*D), k (Hkv*D), v (Hkv*D)
    std::unique_ptr<cpu::PackedMatrix> wo;       // hidden x H*D
    std::unique_ptr<cpu::PackedMatrix> gate_up;  // rows: gate (I), up (I)
    std::unique_ptr<cpu::PackedMatrix> down;     // hidden x I
  };

  CpuLlamaModel(const ModelConfig& config,
                std::unique_ptr<WeightSource> weights)
      : config_(config), weights_(std::move(weights)), rope_(config) {}

  [[nodiscard]] absl::Status LoadWeights();
  // Times a batch-1 pass over every packed matrix with small tiles
  // prefetched into L1, then L2 (alternating, best of 3) and keeps the
  // faster process-wide (matmul.h, SetSmallTilePrefetch).
  void TuneTilePrefetch();
  // The tensor `name`, counted once in source_bytes_.
  [[nodiscard]] absl::StatusOr<RawTensor> GetCounted(const std::string& name);
  [[nodiscard]] absl::StatusOr<std::vector<float>> LoadVector(
      const std::string& name);
  [[nodiscard]] absl::StatusOr<std::unique_ptr<cpu::PackedMatrix>> PackFused(
      const std::vector<std::string>& names);
  void Embed(const ForwardBatch& batch);
  void AttentionBlock(const Layer& layer, int layer_index,
                      const ForwardBatch& batch, const KvCacheView& kv,
                      cpu::KvResidual* residual);
  void MlpBlock(const Layer& layer, int64_t num_tokens);

  ModelConfig config_;
  std::unique_ptr<WeightSource> weights_;
  Rope rope_;
  RawTensor token_embd_;
  std::vector<float> output_norm_;
  std::unique_ptr<cpu::PackedMatrix> output_;
  std::vector<Layer> layers_;
  size_t weight_bytes_ = 0;
  std::string prefetch_note_;
  std::map<std::string, int64_t> source_bytes_;
  std::set<std::string> counted_;

  // Scratch, grown on demand and reused across steps.
  std::vector<float> x_, h_, qkv_, attn_, gate_up_, act_, cos_, sin_;
  // Only for a batch with sink_lens: queries rotated at their KV index (rows
  // of qkv_'s stride) and that rotation's tables.
  std::vector<float> q_sink_, cos_kv_, sin_kv_;
  std::vector<float> block_mass_;  // [S * max_blocks_per_seq] or empty
  absl::flat_hash_map<const std::byte*, std::unique_ptr<cpu::KvResidual>>
      residuals_;
};

}  // namespace kvserve::models
