// A non-owning view of the paged KV bytes the forward pass reads and writes.
// The engine's KvCacheStorage owns the memory; the layout per layer, for K
// and V separately, is [num_blocks][block_size][num_kv_heads][head_dim] fp32.
#pragma once

#include <cstdint>
#include <vector>

namespace kvserve::models {

struct KvCacheView {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  std::vector<float*> k;  // per layer
  std::vector<float*> v;  // per layer

  // Elements per token slot (all KV heads of one layer).
  int64_t SlotStride() const {
    return static_cast<int64_t>(num_kv_heads) * head_dim;
  }
};

}  // namespace kvserve::models
