// KV cache sizing: the one place that turns an attention shape and a KV
// format (kv_format.h) into bytes per token, per block, per sequence, and
// into how many sequences a byte budget holds (paged vs naive max-length
// reservation). The engine
// sizes its KV pool with it; `kvserve plan` prints it. Takes plain numbers
// (never a models:: type: kvcache does not depend on models). It owns no
// memory and knows nothing about weights or activations.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvcache/kv_format.h"

namespace kvserve::kvcache {

// The attention shape that determines KV size. GQA/MHA: num_kv_heads K and V
// rows of head_dim per layer, kv_lora_rank = qk_rope_head_dim = 0.
// Multi-head latent attention (MLA, DeepSeek-V2/V3): kv_lora_rank > 0; each
// layer caches one row of kv_lora_rank + qk_rope_head_dim elements (the
// compressed latent and the decoupled RoPE key, shared by all heads) and
// num_kv_heads / head_dim are ignored.
struct KvShape {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int kv_lora_rank = 0;
  int qk_rope_head_dim = 0;

  [[nodiscard]] constexpr bool IsLatent() const { return kv_lora_rank > 0; }
  // Elements of the one MLA row per layer: kv_lora_rank + qk_rope_head_dim.
  [[nodiscard]] constexpr int LatentDim() const {
    return kv_lora_rank + qk_rope_head_dim;
  }
};

// KV heads one tensor-parallel rank stores: ceil(num_kv_heads / tp).
// NOTE: when tp > num_kv_heads, KV heads are replicated (each rank keeps the
// one head its query heads use), so a rank never holds fewer than 1 head; with
// an uneven split the largest shard sizes every rank's pool.
// Preconditions: num_kv_heads >= 1, tp >= 1.
[[nodiscard]] int KvHeadsPerRank(int num_kv_heads, int tp);

// Bytes of K and V one token occupies on one rank. GQA/MHA:
// 2 (K and V) x num_layers x KvHeadsPerRank(num_kv_heads, tp) x
// KvRowBytes(dtype, head_dim). MLA: num_layers x KvRowBytes(dtype,
// LatentDim()), the latent row stored like one head row (int8/int4 put a
// scale on every 32 elements of it). The latent is not split across heads,
// so every tensor-parallel rank stores all of it: tp does not change the MLA
// figure. Preconditions: positive shape, tp >= 1.
[[nodiscard]] int64_t KvBytesPerToken(const KvShape& shape, KvDtype dtype,
                                      int tp = 1);
// KvBytesPerToken x block_size (all layers of one block). block_size >= 1.
[[nodiscard]] int64_t KvBytesPerBlock(const KvShape& shape, KvDtype dtype,
                                      int block_size, int tp = 1);

// Blocks needed for `tokens` tokens: ceil(tokens / block_size).
[[nodiscard]] int64_t BlocksForTokens(int64_t tokens, int block_size);

struct KvPlanInput {
  KvShape shape;
  KvDtype dtype = KvDtype::kBF16;
  int tp = 1;
  int block_size = 16;
  // Full context N: tokens one sequence may reach.
  int64_t context_len = 0;
  // Length a naive allocator reserves per sequence; 0 = context_len.
  int64_t naive_max_len = 0;
  // Mean actual sequence length for the idle-KV comparison; 0 = skip it.
  int64_t mean_len = 0;
  // Sequences the caller wants to run at once; 0 = not asked.
  int64_t concurrency = 0;
  // KV bytes available on one rank; 0 = unknown (budget fields stay 0).
  int64_t budget_bytes = 0;
};

struct KvPlan {
  // KvHeadsPerRank; 1 for MLA (the latent row, whole on every rank).
  int kv_heads_per_rank = 0;
  int64_t bytes_per_token = 0;
  int64_t bytes_per_block = 0;
  // One sequence at context_len: exact bytes, blocks, and bytes as paged
  // (blocks_per_seq x bytes_per_block, >= bytes_per_seq).
  int64_t bytes_per_seq = 0;
  int64_t blocks_per_seq = 0;
  int64_t paged_bytes_per_seq = 0;
  // concurrency x paged_bytes_per_seq (0 when concurrency is 0).
  int64_t bytes_for_concurrency = 0;

  // Budget (all 0 when budget_bytes is 0).
  int64_t budget_blocks = 0;          // budget / bytes_per_block
  int64_t paged_seqs_at_context = 0;  // budget / paged_bytes_per_seq
  int64_t naive_seqs = 0;          // budget / (naive_max_len x bytes_per_token)
  int64_t paged_seqs_at_mean = 0;  // budget / (ceil(mean/block) blocks)
  bool concurrency_fits = false;   // bytes_for_concurrency <= budget

  // Idle KV at mean_len (all 0 when mean_len is 0). Naive reservation holds
  // naive_max_len tokens and uses mean_len: idle = 1 - mean/max. Paging holds
  // whole blocks; the last one is on average half empty (block/2 tokens), so
  // idle = (block/2) / (mean + block/2), always under one block.
  int64_t naive_idle_bytes_per_seq = 0;
  int64_t paged_idle_bytes_per_seq = 0;
  double naive_idle_fraction = 0.0;
  double paged_idle_fraction = 0.0;
};

// OK iff ComputeKvPlan's preconditions hold; otherwise InvalidArgument naming
// the field and its limit. Call it on anything a user or a file supplied.
[[nodiscard]] absl::Status ValidateKvPlanInput(const KvPlanInput& in);

// Precondition: ValidateKvPlanInput(in).ok() (KV_CHECKed).
[[nodiscard]] KvPlan ComputeKvPlan(const KvPlanInput& in);

}  // namespace kvserve::kvcache
