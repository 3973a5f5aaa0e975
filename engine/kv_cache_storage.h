// Owns the KV bytes on the CPU: per layer, K and V, each
// [num_blocks][block_size][num_kv_heads][head_dim] fp32, allocated once at
// start-up from a byte budget. Block bookkeeping (which block belongs to
// whom) lives in kvcache/, not here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/kv_view.h"

namespace kvserve::engine {

struct KvStorageConfig {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;
  int32_t num_blocks = 0;  // if 0, derived from budget_bytes
  int64_t budget_bytes = 0;
};

class KvCacheStorage {
 public:
  // Fails with InvalidArgument (naming the field) on bad shapes or a budget
  // below one block, ResourceExhausted if the memory cannot be allocated.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvCacheStorage>> Create(
      const KvStorageConfig& config);

  int32_t num_blocks() const { return view_.num_blocks; }
  int32_t block_size() const { return view_.block_size; }
  int64_t bytes_per_block() const { return bytes_per_block_; }
  int64_t total_bytes() const { return bytes_per_block_ * num_blocks(); }
  const models::KvCacheView& view() const { return view_; }

  // Copies every layer's K/V of block `src` into block `dst` (copy-on-write
  // and swap use it).
  void CopyBlock(int32_t src, int32_t dst);

 private:
  KvCacheStorage() = default;

  models::KvCacheView view_;
  int64_t bytes_per_block_ = 0;
  std::vector<std::unique_ptr<float[]>> buffers_;  // 2 per layer
};

}  // namespace kvserve::engine
