// BlockPool: the mechanism of paged KV bookkeeping. It owns the metadata of
// `num_blocks` fixed-size KV blocks (never the KV bytes: engine/ owns those):
// a reference count, an optional content hash for prefix caching, and
// intrusive links of a free queue. It knows nothing about requests or block
// tables (KvCacheManager does).
//
// Block states:
//   free    ref 0, no hash, in the free queue
//   cached  ref 0, hash set, in the free queue (evictable, findable by hash)
//   active  ref > 0, not in the free queue (may also carry a hash)
//
// Free queue: doubly linked through the block metadata, so a cached block
// hit by a prefix lookup leaves it in O(1). Allocate pops from the head,
// Free appends to the tail: the head is the least recently freed block, so
// the queue is the LRU eviction order of cached blocks.
//
//   head -> [7] <-> [3] <-> [9] <-> ... <-> [2] <- tail
//           evicted first                   evicted last
//
// Hash map, lazy deletion: eviction (cached -> free) only clears the
// block's own has_hash flag and never touches the hash map, so its cost does
// not grow with the map (an erase in a 1M-entry map is a cache miss or two,
// which made eviction 15-40x slower at 1M blocks than at 1K). The evicted
// block keeps its old hash in hashes_, and the map entry hash -> block goes
// stale (the block no longer carries it). A lookup treats a stale entry as
// a miss (GetCachedBlock stays const and side-effect free). CacheBlock
// overwrites a stale entry for its hash, and when it gives a block a new
// hash it first erases that block's own stale entry (old hash -> block):
// that map access moves from eviction, on the allocation path, to
// registering computed content, which follows a forward pass anyway. So a
// block is named by at most one entry, under hashes_[block], and the map
// never exceeds num_blocks entries: no sweep is needed.
//
// Invariants (CheckInvariants verifies them all):
//   - every ref count is >= 0;
//   - the free queue holds exactly the blocks with ref 0, each once, with
//     consistent prev/next links;
//   - every block that carries a hash is mapped under its own hash (a live
//     entry); every map entry hash -> block has hashes_[block] == hash, so
//     an entry whose block has no hash is stale, and the map has at most
//     num_blocks entries;
//   - num_free() + num_active() == num_blocks(), and num_cached_evictable()
//     counts the ref-0 blocks that carry a hash.
//
// Evictions: Allocate says why it needs blocks (EvictReason); every cached
// block it evicts is counted under that reason, and, when an observer is
// set, reported with how long it sat evictable and how many prefix hits it
// served while it held its hash (RecordHits), for the metrics.
//
// Thread safety: none. Engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/numeric/int128.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvserve::kvcache {

using BlockId = int32_t;
// Content hash of a full block (chained over the prefix; see
// kvcache/block_hash.h). 128 bits: a collision among the blocks of a pool is
// astronomically unlikely, and callers compare tokens on a hit anyway.
using BlockHash = absl::uint128;

inline constexpr BlockId kNoBlock = -1;

// One whole-block copy the engine performs before a step's forward (see
// scheduler::SchedulerOutput): KV block -> swap slot (swap out), swap slot ->
// KV block (swap in), or KV block -> KV block (copy-on-write). `src` and
// `dst` are KV block ids or swap slot ids accordingly.
struct BlockMove {
  int32_t src = 0;
  int32_t dst = 0;
  bool operator==(const BlockMove&) const = default;
};

// What a block is allocated for: the reason an eviction is counted under.
enum class EvictReason : uint8_t {
  kAdmit,        // a request's first blocks (admission, readmission, fork)
  kGrow,         // a running request's next tokens
  kCopyOnWrite,  // a private copy of a shared block about to be written
  kSwapIn,       // blocks for a swapped-out request's slots
};
inline constexpr int kNumEvictReasons = 4;
// "admit", "grow", "copy_on_write", "swap_in" (static storage).
[[nodiscard]] const char* EvictReasonName(EvictReason reason);

// One cached block reclaimed for new content.
struct Eviction {
  EvictReason reason = EvictReason::kGrow;
  BlockHash hash = 0;      // the content hash it lost
  double age_seconds = 0;  // since it last became evictable (ref 0, hashed)
  int32_t reuses = 0;      // prefix hits it served while hashed
};
using EvictionObserver = std::function<void(const Eviction&)>;

class BlockPool {
 public:
  // All blocks start free, queued in id order (block 0 at the head).
  // Precondition: num_blocks >= 1 (KV_CHECKed).
  explicit BlockPool(int32_t num_blocks);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // Pops `n` blocks from the head of the free queue and gives each ref 1.
  // A popped cached block loses its hash (it is evicted; its map entry goes
  // stale, O(1) whatever the map size). Returns them in pop order.
  // Precondition: 0 <= n <= num_free() (KV_CHECKed). Evictions count
  // under `reason`.
  [[nodiscard]] std::vector<BlockId> Allocate(
      int32_t n, EvictReason reason = EvictReason::kGrow);

  // Drops one reference from each block, in the given order. Blocks that
  // reach ref 0 are appended to the free-queue tail in that order, so pass a
  // block table tail-first to have tails evicted first.
  // Precondition: every block has ref >= 1 (KV_CHECKed).
  void Free(absl::Span<const BlockId> blocks);

  // Adds one reference to each block: a cached block (ref 0) leaves the free
  // queue; an active block is shared (fork, prefix hit on a live block).
  // Precondition: each block is active or cached, never plain free
  // (KV_CHECKed).
  void Touch(absl::Span<const BlockId> blocks);

  // Adds one reference to `block` in any state: a free or cached block
  // leaves the free queue. For a block whose content its caller tracks
  // itself (KvCacheManager's tails: plain free blocks it knows are intact).
  void Pin(BlockId block);

  // Records that active block `block` holds the full-block content `hash`,
  // making it findable by GetCachedBlock (and, once freed, evictable rather
  // than free). Returns false and changes nothing when another block already
  // caches `hash` (the duplicate stays uncached). Overwrites a stale entry
  // for `hash` and erases the block's own stale entry, if any. Precondition:
  // `block` is active and has no hash (KV_CHECKed).
  bool CacheBlock(BlockId block, BlockHash hash);

  // Drops the hash of evictable cached block `block` (a purge): it becomes
  // plain free where it is in the queue, no longer findable. False, with
  // nothing changed, for a block that is not cached with ref 0.
  bool Uncache(BlockId block);

  // The block caching `hash`, active or evictable; nullopt when none
  // (including when the map entry for `hash` is stale). O(1), no side effect.
  // NOTE: callers must compare the block's tokens too: equal hashes do not
  // prove equal content.
  [[nodiscard]] std::optional<BlockId> GetCachedBlock(BlockHash hash) const;

  // Counts one prefix hit on each block (reported at its eviction).
  void RecordHits(absl::Span<const BlockId> blocks);

  // Cached blocks evicted so far for `reason`.
  [[nodiscard]] int64_t evictions(EvictReason reason) const {
    return evictions_[static_cast<int>(reason)];
  }
  // Called for every eviction from now on (null: none).
  void set_eviction_observer(EvictionObserver observer) {
    observer_ = std::move(observer);
  }

  [[nodiscard]] int32_t ref_count(BlockId block) const;
  // ref_count without the id check, for hot loops over ids that came from
  // this pool. Precondition: 0 <= block < num_blocks().
  [[nodiscard]] int32_t ref_count_unchecked(BlockId block) const {
    return blocks_[block].ref_count;
  }
  [[nodiscard]] std::optional<BlockHash> block_hash(BlockId block) const;

  [[nodiscard]] int32_t num_blocks() const {
    return static_cast<int32_t>(blocks_.size());
  }
  // Ref-0 blocks, including evictable cached ones.
  [[nodiscard]] int32_t num_free() const { return num_free_; }
  // Ref-0 blocks that carry a hash (a subset of num_free()).
  [[nodiscard]] int32_t num_cached_evictable() const {
    return num_cached_evictable_;
  }
  // Blocks with ref > 0.
  [[nodiscard]] int32_t num_active() const { return num_blocks() - num_free_; }

  // The free queue from head (evicted first) to tail. O(num_free); tests.
  [[nodiscard]] std::vector<BlockId> FreeQueue() const;

  // Map entries, live and stale (<= num_blocks). Tests and benchmarks.
  [[nodiscard]] int64_t hash_map_size() const {
    return static_cast<int64_t>(cached_.size());
  }

  // Verifies every invariant in the header comment; O(num_blocks).
  // Returns Internal naming the first violation.
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  // 16 bytes: the free-queue walk touches only these. Hashes live apart in
  // hashes_ (read on lookups and CacheBlock only; eviction never reads
  // them).
  struct BlockMeta {
    int32_t ref_count = 0;
    bool has_hash = false;
    bool in_free_queue = false;
    BlockId prev = kNoBlock;  // free-queue links
    BlockId next = kNoBlock;
  };

  void PushBack(BlockId block);
  void Unlink(BlockId block);
  void CheckId(BlockId block) const;
  // Whether `block` currently carries `hash` (the map entry is live).
  [[nodiscard]] bool IsLive(BlockId block, BlockHash hash) const {
    return blocks_[block].has_hash && hashes_[block] == hash;
  }

  std::vector<BlockMeta> blocks_;
  // Per block; valid while has_hash; after eviction, the key of the
  // block's stale map entry if that entry still names it.
  std::vector<BlockHash> hashes_;
  BlockId head_ = kNoBlock;
  BlockId tail_ = kNoBlock;
  int32_t num_free_ = 0;
  int32_t num_cached_evictable_ = 0;
  // hash -> block: live entries plus stale ones (see the header comment).
  absl::flat_hash_map<BlockHash, BlockId> cached_;
  // Per block: when it last became evictable (steady clock, ns) and its
  // prefix hits since it was last allocated.
  std::vector<int64_t> cached_since_ns_;
  std::vector<int32_t> reuses_;
  std::array<int64_t, kNumEvictReasons> evictions_{};
  EvictionObserver observer_;
};

}  // namespace kvserve::kvcache
