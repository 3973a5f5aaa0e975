#include "engine/kv_cache_storage.h"

#include <cstring>
#include <new>

#include "absl/strings/str_format.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::engine {

absl::StatusOr<std::unique_ptr<KvCacheStorage>> KvCacheStorage::Create(
    const KvStorageConfig& c) {
  if (c.num_layers <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 ||
      c.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV storage: layers (%d), kv_heads (%d), head_dim (%d) and "
        "block_size (%d) must be > 0",
        c.num_layers, c.num_kv_heads, c.head_dim, c.block_size));
  }
  const kvcache::KvShape shape{c.num_layers, c.num_kv_heads, c.head_dim};
  const int64_t per_block =
      kvcache::KvBytesPerBlock(shape, kvcache::KvDtype::kF32, c.block_size);
  int64_t blocks = c.num_blocks;
  if (blocks <= 0) blocks = c.budget_bytes / per_block;
  if (blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV storage: budget of %d bytes is below one block (%d bytes of %d "
        "tokens)",
        c.budget_bytes, per_block, c.block_size));
  }
  if (blocks > INT32_MAX) blocks = INT32_MAX;
  auto s = std::unique_ptr<KvCacheStorage>(new KvCacheStorage());
  s->bytes_per_block_ = per_block;
  s->view_ = {static_cast<int32_t>(blocks),
              c.block_size,
              c.num_kv_heads,
              c.head_dim,
              {},
              {}};
  const int64_t floats =
      blocks * c.block_size * static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  for (int l = 0; l < 2 * c.num_layers; ++l) {
    // Zero-filled so that a block never written reads as zeros, not garbage.
    std::unique_ptr<float[]> buf(new (std::nothrow) float[floats]());
    if (buf == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "KV storage: cannot allocate %d bytes per layer", floats * 4));
    }
    (l % 2 == 0 ? s->view_.k : s->view_.v).push_back(buf.get());
    s->buffers_.push_back(std::move(buf));
  }
  return s;
}

void KvCacheStorage::CopyBlock(int32_t src, int32_t dst) {
  const int64_t n = static_cast<int64_t>(view_.block_size) * view_.SlotStride();
  for (size_t l = 0; l < view_.k.size(); ++l) {
    std::memcpy(view_.k[l] + dst * n, view_.k[l] + src * n, n * sizeof(float));
    std::memcpy(view_.v[l] + dst * n, view_.v[l] + src * n, n * sizeof(float));
  }
}

}  // namespace kvserve::engine
