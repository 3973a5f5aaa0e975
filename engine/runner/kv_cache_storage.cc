#include "engine/runner/kv_cache_storage.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
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
  KV_RETURN_IF_ERROR(kvcache::CheckKvDtypeShape(c.dtype, c.head_dim));
  const kvcache::KvShape shape{c.num_layers, c.num_kv_heads, c.head_dim};
  const int64_t per_block =
      kvcache::KvBytesPerBlock(shape, c.dtype, c.block_size);
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
  s->view_.num_blocks = static_cast<int32_t>(blocks);
  s->view_.block_size = c.block_size;
  s->view_.num_kv_heads = c.num_kv_heads;
  s->view_.head_dim = c.head_dim;
  s->view_.dtype = c.dtype;
  const int64_t plane_bytes = blocks * s->view_.BlockBytes();
  for (int l = 0; l < 2 * c.num_layers; ++l) {
    KV_ASSIGN_OR_RETURN(PageBuffer buf,
                        PageBuffer::Reserve(plane_bytes, "KV storage"));
    (l % 2 == 0 ? s->view_.k : s->view_.v)
        .push_back(reinterpret_cast<std::byte*>(buf.data()));
    s->buffers_.push_back(std::move(buf));
  }
  return s;
}

void KvCacheStorage::CopyBlock(int32_t src, int32_t dst) {
  const int64_t n = view_.BlockBytes();
  for (size_t l = 0; l < view_.k.size(); ++l) {
    std::memcpy(view_.k[l] + dst * n, view_.k[l] + src * n, n);
    std::memcpy(view_.v[l] + dst * n, view_.v[l] + src * n, n);
  }
}

void KvCacheStorage::ZeroBlocks(int32_t first, int32_t count) {
  const int64_t n = view_.BlockBytes();
  for (PageBuffer& b : buffers_) b.Zero(first * n, count * n);
}

int64_t KvCacheStorage::ResidentBytes() const {
  int64_t n = 0;
  for (const PageBuffer& b : buffers_) n += b.ResidentBytes();
  return n;
}

}  // namespace kvserve::engine
