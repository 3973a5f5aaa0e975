#include "kvcache/kv_cache_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::kvcache {
namespace {

const std::vector<BlockId>& EmptyTable() {
  static const auto* const kEmpty = new std::vector<BlockId>();
  return *kEmpty;
}

}  // namespace

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size)
    : pool_(num_blocks), block_size_(block_size) {
  KV_CHECK(block_size >= 1, "block_size=", block_size);
}

int32_t KvCacheManager::NumBlocksNeeded(RequestId request,
                                        int64_t num_tokens_total) const {
  const int64_t want = BlocksForTokens(num_tokens_total, block_size_);
  const int64_t have = static_cast<int64_t>(GetBlockTable(request).size());
  // NOTE: clamp before narrowing: a caller may ask about absurd lengths.
  return static_cast<int32_t>(std::clamp<int64_t>(want - have, 0, INT32_MAX));
}

bool KvCacheManager::CanAllocate(RequestId request, int64_t total_tokens,
                                 int32_t watermark_blocks) const {
  const int32_t needed = NumBlocksNeeded(request, total_tokens);
  if (needed == 0) return true;
  return static_cast<int64_t>(pool_.num_free()) - needed >= watermark_blocks;
}

std::optional<std::vector<BlockId>> KvCacheManager::Allocate(
    RequestId request, int64_t total_tokens) {
  const int32_t needed = NumBlocksNeeded(request, total_tokens);
  if (needed > pool_.num_free()) return std::nullopt;
  if (needed == 0) return std::vector<BlockId>();
  std::vector<BlockId> fresh = pool_.Allocate(needed);
  std::vector<BlockId>& table = tables_[request];
  table.insert(table.end(), fresh.begin(), fresh.end());
  return fresh;
}

int32_t KvCacheManager::Free(RequestId request) {
  auto it = tables_.find(request);
  if (it == tables_.end()) return 0;
  std::vector<BlockId>& table = it->second;
  const auto n = static_cast<int32_t>(table.size());
  std::reverse(table.begin(), table.end());  // tail-first: tails evict first
  pool_.Free(table);
  tables_.erase(it);
  return n;
}

void KvCacheManager::Fork(RequestId parent, RequestId child) {
  KV_CHECK(parent != child, "fork onto itself: ", parent);
  auto it = tables_.find(parent);
  KV_CHECK(it != tables_.end(), "fork of request ", parent, " without blocks");
  KV_CHECK(!tables_.contains(child), "fork child ", child, " has blocks");
  std::vector<BlockId> copy = it->second;  // `it` dies on insertion
  pool_.Touch(copy);
  tables_.emplace(child, std::move(copy));
}

const std::vector<BlockId>& KvCacheManager::GetBlockTable(
    RequestId request) const {
  auto it = tables_.find(request);
  return it == tables_.end() ? EmptyTable() : it->second;
}

KvUsage KvCacheManager::Usage() const {
  KvUsage u;
  u.total_blocks = pool_.num_blocks();
  u.free_blocks = pool_.num_free();
  u.cached_evictable_blocks = pool_.num_cached_evictable();
  u.active_blocks = pool_.num_active();
  u.usage = static_cast<double>(u.active_blocks) / u.total_blocks;
  return u;
}

absl::Status KvCacheManager::CheckInvariants() const {
  if (absl::Status s = pool_.CheckInvariants(); !s.ok()) return s;
  std::vector<int32_t> holders(pool_.num_blocks(), 0);
  for (const auto& [id, table] : tables_) {
    if (table.empty()) {
      return absl::InternalError(absl::StrCat("request ", id, " empty table"));
    }
    for (const BlockId b : table) {
      if (b < 0 || b >= pool_.num_blocks()) {
        return absl::InternalError(
            absl::StrCat("request ", id, " holds bad block ", b));
      }
      ++holders[b];
    }
  }
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (holders[b] != pool_.ref_count(b)) {
      return absl::InternalError(
          absl::StrCat("block ", b, " ref=", pool_.ref_count(b), " but ",
                       holders[b], " tables hold it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::kvcache
