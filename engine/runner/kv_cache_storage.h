// Owns the KV bytes on the CPU: per layer, K and V planes of
// [num_blocks][block_size][num_kv_heads][row] in the configured dtype
// (models/kv_view.h), reserved once at start-up from a byte budget and
// committed page by page as blocks are first written (PageBuffer), so
// start-up does not depend on the budget. A block never written reads as
// zeros. Block bookkeeping (which block belongs to whom) lives in kvcache/,
// not here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/page_buffer.h"
#include "kvcache/kv_sizing.h"
#include "models/kv_view.h"

namespace kvserve::engine {

struct KvStorageConfig {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t num_blocks = 0;  // if 0, derived from budget_bytes
  int64_t budget_bytes = 0;
  kvcache::KvDtype dtype = kvcache::KvDtype::kF32;
};

class KvCacheStorage {
 public:
  // Fails with InvalidArgument (naming the field) on bad shapes, a dtype the
  // shape cannot use, or a budget below one block; ResourceExhausted if the
  // memory cannot be reserved.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvCacheStorage>> Create(
      const KvStorageConfig& config);

  int32_t num_blocks() const { return view_.num_blocks; }
  int32_t block_size() const { return view_.block_size; }
  kvcache::KvDtype dtype() const { return view_.dtype; }
  // All layers' K and V of one block: kvcache::KvBytesPerBlock.
  int64_t bytes_per_block() const { return bytes_per_block_; }
  int64_t total_bytes() const { return bytes_per_block_ * num_blocks(); }
  const models::KvCacheView& view() const { return view_; }

  // Copies every layer's K/V of block `src` into block `dst` (copy-on-write
  // and swap use it).
  void CopyBlock(int32_t src, int32_t dst);

  // Makes blocks [first, first + count) read as zeros again and returns
  // their whole pages to the kernel.
  void ZeroBlocks(int32_t first, int32_t count);

  // Bytes of the pool backed by memory now (the rest is reserved only).
  [[nodiscard]] int64_t ResidentBytes() const;

 private:
  KvCacheStorage() = default;

  models::KvCacheView view_;
  int64_t bytes_per_block_ = 0;
  std::vector<PageBuffer> buffers_;  // 2 per layer: K, V
};

}  // namespace kvserve::engine
