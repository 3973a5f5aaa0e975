#include "kvcache/block_pool.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace kvserve::kvcache {
namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* EvictReasonName(EvictReason reason) {
  switch (reason) {
    case EvictReason::kAdmit:
      return "admit";
    case EvictReason::kGrow:
      return "grow";
    case EvictReason::kCopyOnWrite:
      return "copy_on_write";
    case EvictReason::kSwapIn:
      return "swap_in";
  }
  return "unknown";
}

BlockPool::BlockPool(int32_t num_blocks) {
  KV_CHECK(num_blocks >= 1, "num_blocks=", num_blocks);
  blocks_.resize(num_blocks);
  hashes_.resize(num_blocks);
  cached_since_ns_.resize(num_blocks, 0);
  reuses_.resize(num_blocks, 0);
  for (BlockId b = 0; b < num_blocks; ++b) PushBack(b);
}

std::vector<BlockId> BlockPool::Allocate(int32_t n, EvictReason reason) {
  KV_CHECK(n >= 0 && n <= num_free_, "n=", n, " num_free=", num_free_);
  std::vector<BlockId> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    const BlockId b = head_;
    BlockMeta& m = blocks_[b];
    Unlink(b);
    if (m.has_hash) {  // cached -> free (evict), then as below
      // Lazy deletion: the map entry goes stale (no map access here).
      m.has_hash = false;
      --num_cached_evictable_;
      ++evictions_[static_cast<int>(reason)];
      if (observer_) {
        observer_(
            {reason, hashes_[b],
             1e-9 * static_cast<double>(SteadyNanos() - cached_since_ns_[b]),
             reuses_[b]});
      }
    }
    reuses_[b] = 0;
    m.ref_count = 1;  // free -> active
    out.push_back(b);
  }
  return out;
}

void BlockPool::Free(absl::Span<const BlockId> blocks) {
  for (const BlockId b : blocks) {
    CheckId(b);
    BlockMeta& m = blocks_[b];
    KV_CHECK(m.ref_count >= 1, "block ", b, " freed at ref 0");
    if (--m.ref_count > 0) continue;  // active -> active (one owner fewer)
    // active -> cached (has hash) | active -> free (no hash)
    if (m.has_hash) {
      ++num_cached_evictable_;
      cached_since_ns_[b] = SteadyNanos();
    }
    PushBack(b);
  }
}

void BlockPool::Touch(absl::Span<const BlockId> blocks) {
  for (const BlockId b : blocks) {
    CheckId(b);
    BlockMeta& m = blocks_[b];
    if (m.ref_count == 0) {  // cached -> active
      KV_CHECK(m.has_hash, "block ", b, " touched while plain free");
      Unlink(b);
      --num_cached_evictable_;
    }
    ++m.ref_count;  // active -> active (one owner more)
  }
}

void BlockPool::Pin(BlockId block) {
  CheckId(block);
  BlockMeta& m = blocks_[block];
  if (m.ref_count == 0) {  // free | cached -> active
    Unlink(block);
    if (m.has_hash) --num_cached_evictable_;
  }
  ++m.ref_count;
}

bool BlockPool::Uncache(BlockId block) {
  CheckId(block);
  BlockMeta& m = blocks_[block];
  if (m.ref_count != 0 || !m.has_hash) return false;
  m.has_hash = false;  // lazy deletion, as in Allocate
  --num_cached_evictable_;
  reuses_[block] = 0;
  return true;
}

bool BlockPool::CacheBlock(BlockId block, BlockHash hash) {
  CheckId(block);
  BlockMeta& m = blocks_[block];
  KV_CHECK(m.ref_count >= 1 && !m.has_hash, "block ", block,
           " ref=", m.ref_count, " has_hash=", m.has_hash);
  // active -> active (hashed; becomes cached when its last owner frees it)
  auto [it, inserted] = cached_.try_emplace(hash, block);
  if (!inserted) {
    if (it->second == block) {  // its own stale entry: live again
      m.has_hash = true;
      return true;  // hashes_[block] == hash already
    }
    if (IsLive(it->second, hash)) return false;  // a duplicate
    it->second = block;  // overwrite another block's stale entry
  }
  // Erase the block's own stale entry (its previous hash), if any: the one
  // map access that eviction skipped. Keeps <= 1 entry per block.
  if (auto old = cached_.find(hashes_[block]);
      old != cached_.end() && old->first != hash && old->second == block) {
    cached_.erase(old);
  }
  m.has_hash = true;
  hashes_[block] = hash;
  return true;
}

std::optional<BlockId> BlockPool::GetCachedBlock(BlockHash hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end() || !IsLive(it->second, hash)) return std::nullopt;
  return it->second;
}

void BlockPool::RecordHits(absl::Span<const BlockId> blocks) {
  for (const BlockId b : blocks) {
    CheckId(b);
    ++reuses_[b];
  }
}

int32_t BlockPool::ref_count(BlockId block) const {
  CheckId(block);
  return blocks_[block].ref_count;
}

std::optional<BlockHash> BlockPool::block_hash(BlockId block) const {
  CheckId(block);
  const BlockMeta& m = blocks_[block];
  if (!m.has_hash) return std::nullopt;
  return hashes_[block];
}

std::vector<BlockId> BlockPool::FreeQueue() const {
  std::vector<BlockId> out;
  out.reserve(num_free_);
  for (BlockId b = head_; b != kNoBlock; b = blocks_[b].next) {
    out.push_back(b);
    if (out.size() > blocks_.size()) break;  // a cycle: CheckInvariants says
  }
  return out;
}

absl::Status BlockPool::CheckInvariants() const {
  const int32_t n = num_blocks();
  // Walk the queue: links, ref 0, no duplicates, no cycle.
  std::vector<bool> seen(n, false);
  int32_t queued = 0;
  BlockId prev = kNoBlock;
  for (BlockId b = head_; b != kNoBlock; prev = b, b = blocks_[b].next) {
    if (b < 0 || b >= n) return absl::InternalError(absl::StrCat("bad id ", b));
    const BlockMeta& m = blocks_[b];
    if (seen[b]) {
      return absl::InternalError(absl::StrCat("block ", b, " queued twice"));
    }
    seen[b] = true;
    ++queued;
    if (m.prev != prev) {
      return absl::InternalError(
          absl::StrCat("block ", b, " prev=", m.prev, ", expected ", prev));
    }
    if (m.ref_count != 0 || !m.in_free_queue) {
      return absl::InternalError(absl::StrCat(
          "queued block ", b, " ref=", m.ref_count, " flag=", m.in_free_queue));
    }
  }
  if (prev != tail_) {
    return absl::InternalError(
        absl::StrCat("tail=", tail_, ", queue ends at ", prev));
  }
  // Every block: ref >= 0; ref 0 <=> queued; hash <=> in the map.
  int32_t ref0 = 0, evictable = 0, hashed = 0;
  for (BlockId b = 0; b < n; ++b) {
    const BlockMeta& m = blocks_[b];
    if (m.ref_count < 0) {
      return absl::InternalError(
          absl::StrCat("block ", b, " ref=", m.ref_count));
    }
    if ((m.ref_count == 0) != seen[b] || m.in_free_queue != seen[b]) {
      return absl::InternalError(
          absl::StrCat("block ", b, " ref=", m.ref_count, " queued=", seen[b]));
    }
    if (m.ref_count == 0) ++ref0;
    if (!m.has_hash) continue;
    ++hashed;
    if (m.ref_count == 0) ++evictable;
    const BlockHash hash = hashes_[b];
    auto it = cached_.find(hash);
    if (it == cached_.end() || it->second != b) {
      return absl::InternalError(absl::StrCat(
          "block ", b, " hash ", absl::Hex(absl::Uint128High64(hash)), ":",
          absl::Hex(absl::Uint128Low64(hash)), " not mapped to it"));
    }
  }
  // Every map entry hash -> b: a valid id with hashes_[b] == hash (live
  // when b carries a hash, stale otherwise; lazy deletion allows that), so
  // at most one entry per block.
  int32_t live = 0;
  for (const auto& [hash, b] : cached_) {
    if (b < 0 || b >= n || hashes_[b] != hash) {
      return absl::InternalError(
          absl::StrCat("map entry ", absl::Hex(absl::Uint128High64(hash)), ":",
                       absl::Hex(absl::Uint128Low64(hash)), " -> ", b,
                       " is not that block's (last) hash"));
    }
    if (blocks_[b].has_hash) ++live;
  }
  if (live != hashed || cached_.size() > static_cast<size_t>(n)) {
    return absl::InternalError(absl::StrCat("hash map has ", cached_.size(),
                                            " entries, ", live, " live, ",
                                            hashed, " hashed blocks"));
  }
  if (queued != num_free_ || ref0 != num_free_ ||
      evictable != num_cached_evictable_) {
    return absl::InternalError(
        absl::StrCat("counts: queued=", queued, " ref0=", ref0,
                     " num_free=", num_free_, " evictable=", evictable,
                     " num_cached_evictable=", num_cached_evictable_));
  }
  return absl::OkStatus();
}

void BlockPool::PushBack(BlockId block) {
  BlockMeta& m = blocks_[block];
  KV_DCHECK(!m.in_free_queue);
  m.prev = tail_;
  m.next = kNoBlock;
  m.in_free_queue = true;
  if (tail_ == kNoBlock) {
    head_ = block;
  } else {
    blocks_[tail_].next = block;
  }
  tail_ = block;
  ++num_free_;
}

void BlockPool::Unlink(BlockId block) {
  BlockMeta& m = blocks_[block];
  KV_DCHECK(m.in_free_queue);
  if (m.prev == kNoBlock) {
    head_ = m.next;
  } else {
    blocks_[m.prev].next = m.next;
  }
  if (m.next == kNoBlock) {
    tail_ = m.prev;
  } else {
    blocks_[m.next].prev = m.prev;
  }
  m.prev = m.next = kNoBlock;
  m.in_free_queue = false;
  --num_free_;
}

void BlockPool::CheckId(BlockId block) const {
  KV_CHECK(block >= 0 && block < num_blocks(), "block id ", block,
           " outside [0, ", num_blocks(), ")");
}

}  // namespace kvserve::kvcache
