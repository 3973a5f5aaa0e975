// A non-owning view of the paged KV bytes the forward pass reads and writes.
// The engine's KvCacheStorage owns the memory. Per layer, K and V are
// separate planes laid out [num_blocks][block_size][num_kv_heads][row], where
// a row is one KV head's head_dim elements in `dtype`
// (kvcache::KvRowBytes(dtype, head_dim) bytes; models/cpu/kv_rows.h has the
// row formats).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvcache/kv_sizing.h"

namespace kvserve::models {

struct KvCacheView {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  kvcache::KvDtype dtype = kvcache::KvDtype::kF32;
  std::vector<std::byte*> k;  // per layer
  std::vector<std::byte*> v;  // per layer

  // Bytes of one KV head's row, of one token slot (all KV heads), and of
  // one block of one layer's K (or V) plane.
  int64_t RowBytes() const { return kvcache::KvRowBytes(dtype, head_dim); }
  int64_t SlotBytes() const { return num_kv_heads * RowBytes(); }
  int64_t BlockBytes() const { return block_size * SlotBytes(); }
};

}  // namespace kvserve::models
