// CPU grouped-query attention over the paged KV cache, flash-attention
// style. Work is split into items of (sequence, query tile of up to
// kAttnQueryTile of its tokens, KV head, key split of kAttnSplitKeys
// positions); an item walks its split in KV tiles of 64 positions (across
// blocks, through per-row offsets into the pages), scores each tile against
// all of its query rows of that KV head (the head's query group as a small
// matrix, so each K/V row is read once per group), and keeps an online
// softmax. Decode reads f32/f16/bf16/q8_0/q4_0 rows in place, converting in
// registers; a prefill tile decodes each KV tile once into f32
// (models/cpu/kv_tile_rows-inl.h; scoring and accumulation in
// models/cpu/attn_rows-inl.h). Items run in parallel and write partial
// (max, sum, accumulator) rows; a combine merges each query head's splits
// in order, so decode spreads one sequence's context over all threads
// (flash-decoding).
//
// Batch- and thread-invariant: a query row's result depends only on its own
// query, position and keys. Split and tile boundaries are positions, a key's
// lane in a tile is its position, every sum has a fixed order, and keys a
// row must not see are masked, so the bits do not depend on the tiling, the
// batch, or the thread count. Does not write the cache (the forward does
// that first).
#pragma once

#include <cstdint>

#include "models/cpu/kv_residual.h"
#include "models/forward_batch.h"
#include "models/kv_view.h"

namespace kvserve::models {

struct AttentionParams {
  int num_heads = 0;  // query heads
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;      // usually 1 / sqrt(head_dim)
  int sliding_window = 0;  // 0 = attend to the whole prefix
};

// Keys per split (rounded up to a multiple of the block size) and query
// tokens per tile.
inline constexpr int32_t kAttnSplitKeys = 256;
inline constexpr int32_t kAttnQueryTile = 16;

// out[i, h * D + d] for every token i of `batch`: causal softmax attention of
// query head h (q row i, stride q_stride floats) over KV positions
// [window_start, position_i] of token i's sequence, read from layer `layer`
// of `kv`. Keys below the sequence's batch.SinkLen() are scored with row i
// of q_sink instead (same layout; may be null when no sequence has sinks).
// out rows are H * D floats, contiguous. With `block_mass` (may be null)
// and batch.mass_seqs, adds to block_mass[s * max_blocks_per_seq + b] the
// softmax weight that sequence s's query rows (all heads) gave the keys of
// its table entry b (ForwardOutput::block_mass, summed over layers).
// With `residual` (int3/int2 only), the rows of the key groups this forward
// writes are read from it in full precision instead of their codes.
void PagedAttention(const AttentionParams& p, const ForwardBatch& batch,
                    const float* q, const float* q_sink, int64_t q_stride,
                    const KvCacheView& kv, int layer, float* out,
                    float* block_mass = nullptr,
                    const cpu::KvResidual* residual = nullptr);

}  // namespace kvserve::models
