// CPU grouped-query attention over a paged KV cache. Reads K/V through each
// sequence's block table; each KV head is read once for its whole group of
// query heads. Does not write the cache (the forward does that first).
#pragma once

#include <cstdint>

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

// out[i, h * D + d] for every token i of `batch`: causal softmax attention of
// query head h (q row i, stride q_stride floats) over KV positions
// [window_start, position_i] of token i's sequence in `k_cache`/`v_cache`
// (one layer, layout of KvCacheView). out rows are H * D floats, contiguous.
void PagedAttention(const AttentionParams& p, const ForwardBatch& batch,
                    const float* q, int64_t q_stride, const float* k_cache,
                    const float* v_cache, int32_t block_size, float* out);

}  // namespace kvserve::models
