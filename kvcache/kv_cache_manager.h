// KvCacheManager: the policy layer over BlockPool. It owns one block table
// per request (an append-only list of block ids; token t of the request lives
// in block `table[t / block_size]`, slot `t % block_size`) and decides how
// many blocks a request needs. It does not own the KV bytes, knows nothing of
// scheduling order, and never fails on "doesn't fit": Allocate returns an
// empty optional and the scheduler reacts (preempts or waits).
//
// Prefix caching: once all tokens of a full block are computed,
// CacheComputedBlocks registers it under its chained hash (block_hash.h) and
// keeps its tokens; FindCachedPrefix (side-effect free) walks a request's
// full blocks from the start and matches them while a block caches the hash
// AND holds the same tokens, parent hash and namespace (a hash match alone is
// never trusted). AllocateWithPrefix takes the matched blocks:
//   cached -> active (an evictable hit leaves the free queue)
//   active -> active (a live hit is shared, ref + 1)
// and Free releases tail-first: active -> cached (hashed) | free, so that
// evictable blocks are reclaimed LRU, tails before heads.
//
// Tails: past the full blocks, a hit may also take the first tokens of one
// more block, so that an exact repeat or the next turn of a chat recomputes
// only what is new. Every block whose content is known is indexed under its
// (parent hash, namespace): full blocks when they are hashed, and the
// partially computed last block of a request when it ends
// (CachePartialBlock; it then goes back to the free queue like any block).
// FindCachedPrefix picks the candidate sharing the longest token prefix
// with the request's next tokens. The source is never written: the hit
// gets a fresh block and a {source, fresh} copy, and the source stays
// pinned until ReleasePinned (after the step's copies ran). An index entry
// is valid while its block has not been reallocated since (a per-block
// generation, bumped on every allocation, proves it); each block has at
// most one entry, so the index never exceeds num_blocks entries.
//
// Copy-on-write: Fork shares every block of the parent (ref + 1), including
// a partially filled last block. AllocateForWrite, before a request writes
// its next tokens, replaces a shared block it is about to write (ref > 1)
// with a fresh one and reports the {old, new} copy; the old one loses a
// reference and stays intact for its other holders. Full blocks that will
// not be written are never copied.
//
// Swap: SwapOut moves a request's first blocks to host swap slots (it
// reports the {block, slot} copies and frees the blocks at once: the engine
// performs swap-outs first in a step, before anything can overwrite them);
// SwapIn gives it fresh blocks for its slots and reports {slot, block}. A
// request holds a block table or swap slots, never both. Shared blocks are
// swapped like any other: reading a shared block disturbs no other holder,
// and the swapped request only drops its reference (it gets private copies
// back on swap-in).
//
// KV tiers (kvtier/): CacheComputedBlocks can record each block it
// registers (TakeNewlyCached) for the engine to copy down. A tier load holds
// the pool blocks it matched and fresh blocks for what it reads
// (ReserveForLoad) outside any table; FinishLoad registers the verified ones
// under their keys, as if computed and freed, and releases the rest, so a
// request admitted after it finds them like any cached prefix.
//
// Invariants (CheckInvariants verifies them):
//   - the pool's invariants hold;
//   - every block's ref count equals the number of block tables holding it
//     plus its pins and tier-load holds (the only owners of references);
//   - no table is empty (a request with no blocks has no table);
//   - a table's hashed blocks are a prefix of it;
//   - the swap space's invariants hold; every used slot belongs to exactly
//     one swapped request, and no request holds both slots and a table.
//
// Thread safety: none. Engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/thread_owner.h"
#include "kvcache/block_hash.h"
#include "kvcache/block_pool.h"
#include "kvcache/prefix_index.h"
#include "kvcache/swap_space.h"

namespace kvserve::kvcache {

// Scheduler-assigned request id (scheduler::RequestId is this type).
using RequestId = int64_t;

// A block CacheComputedBlocks registered: what a KV tier stores it under.
struct CachedBlockRecord {
  BlockId block = kNoBlock;
  BlockHash key = 0;
  BlockHash parent = 0;
  BlockHash ns = 0;
  std::vector<int32_t> tokens;
};

// A change to what the pool's prefix cache can find, for KV events
// (kvevents/): a full block registered under `key` (computed or loaded from
// a tier; `parent` is the previous block's key, kNoParentHash for a
// sequence's first), or a key no longer findable (evicted or purged; only
// `key` is set).
struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockHash key = 0;
  BlockHash parent = 0;
  BlockHash ns = 0;
  std::vector<int32_t> tokens;
};

// KV occupancy in blocks. active + cached_evictable + free_uncached == total.
struct KvUsage {
  int32_t total_blocks = 0;
  int32_t free_blocks = 0;  // includes cached_evictable_blocks
  int32_t cached_evictable_blocks = 0;
  int32_t active_blocks = 0;
  // active_blocks / total_blocks, in [0, 1].
  double usage = 0.0;
  // Host swap slots (one block each): total and held by swapped requests.
  int32_t swap_slots_total = 0;
  int32_t swap_slots_used = 0;
};

// A request's token ids by position, prompt then output, without copying.
struct TokenSequence {
  absl::Span<const int32_t> prompt;
  absl::Span<const int32_t> output;

  [[nodiscard]] int32_t size() const {
    return static_cast<int32_t>(prompt.size() + output.size());
  }
  // Copies tokens [begin, begin + n) to `out` (n entries).
  // Precondition: 0 <= begin, begin + n <= size().
  void Copy(int32_t begin, int32_t n, int32_t* out) const;
};

// The cached prefix of a request: its first `blocks.size()` full blocks are
// cached, then the first `tail_tokens` tokens of the next block are those
// of `tail_block` (none when tail_block is kNoBlock): `num_tokens` =
// blocks.size() * block_size + tail_tokens tokens in all.
struct PrefixMatch {
  int32_t num_tokens = 0;
  std::vector<BlockId> blocks;
  BlockId tail_block = kNoBlock;
  int32_t tail_tokens = 0;
  // Matched blocks (the tail included) with ref 0: taking them removes them
  // from the free queue.
  int32_t num_evictable = 0;
};

class KvCacheManager {
 public:
  // Preconditions: num_blocks >= 1, block_size >= 1 (KV_CHECKed).
  // `hash_fn` replaces HashBlockTokens (tests force collisions with it).
  // `num_swap_slots` >= 0 host swap slots (0: no swapping).
  KvCacheManager(int32_t num_blocks, int32_t block_size,
                 BlockHashFn hash_fn = &HashBlockTokens,
                 int32_t num_swap_slots = 0);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // Blocks to add to `request`'s table for it to cover `num_tokens_total`
  // tokens: max(0, ceil(num_tokens_total / block_size) - table size).
  [[nodiscard]] int32_t NumBlocksNeeded(RequestId request,
                                        int64_t num_tokens_total) const;

  // Grows `request`'s table (creating it if needed) to cover `total_tokens`
  // tokens and returns the blocks it appended (empty when none were needed).
  // Returns nullopt, changing nothing, when the pool lacks the blocks.
  //
  //   block_size 4, table [7 3], 6 tokens computed, Allocate(r, 11):
  //   position   0  1  2  3 |  4  5  6  7 |  8  9 10 11
  //   block           7     |      3      |      9       <- appended
  //   region     c  c  c  c |  c  c  n  n |  n  n  n  .
  //   (c: computed, n: to compute now, .: empty slot; 9 = free-queue head)
  //   Returns {9}; the table is [7 3 9]. Existing entries never change.
  // Evictions it causes count under `reason`.
  [[nodiscard]] std::optional<std::vector<BlockId>> Allocate(
      RequestId request, int64_t total_tokens,
      EvictReason reason = EvictReason::kGrow);

  // Prepares `request` to write positions [num_computed_tokens,
  // total_tokens): copy-on-write of a shared block at num_computed_tokens
  // (a fresh block replaces it in the table, {old, new} is appended to
  // *copies, the old one loses this reference), then Allocate. Returns false,
  // changing nothing, when the pool lacks the blocks.
  //
  //   block_size 4, child forked at 6 computed tokens, writes position 6:
  //   parent [7 3]  child [7 3] (3 shared, ref 2, half full)
  //   -> child [7 9], copies += {3, 9}; 3 keeps ref 1 (parent), 7 ref 2.
  [[nodiscard]] bool AllocateForWrite(RequestId request,
                                      int32_t num_computed_tokens,
                                      int64_t total_tokens,
                                      std::vector<BlockMove>* copies);

  // Whether SwapOut(request, num_blocks) may run: the request holds a table
  // of >= num_blocks blocks and the swap space has num_blocks free slots.
  [[nodiscard]] bool CanSwapOut(RequestId request, int32_t num_blocks) const;

  // Copies the first `num_blocks` blocks of `request`'s table to fresh swap
  // slots (appends {block, slot} to *moves, in table order), then frees its
  // whole table tail-first like Free. Precondition: CanSwapOut (KV_CHECKed).
  void SwapOut(RequestId request, int32_t num_blocks,
               std::vector<BlockMove>* moves);

  // Gives swapped-out `request` a table of fresh blocks, one per slot in
  // order, appends {slot, block} to *moves and frees the slots. Returns
  // false, changing nothing, when the pool lacks the blocks. The new blocks
  // carry no hash; CacheComputedBlocks registers them again (as duplicates
  // when their old copies are still cached). Precondition: `request` is
  // swapped out (KV_CHECKed).
  [[nodiscard]] bool SwapIn(RequestId request, std::vector<BlockMove>* moves);

  // Swap slots `request` holds (0 when it is not swapped out).
  [[nodiscard]] int32_t num_swapped_blocks(RequestId request) const;
  [[nodiscard]] int32_t num_swapped_requests() const {
    return static_cast<int32_t>(swapped_.size());
  }

  // Side-effect free: the longest cached prefix of `tokens` under namespace
  // `ns`, leaving at least the last token uncached (its logits are needed):
  // full blocks first (a block matches only when its hash is cached and its
  // stored tokens, parent hash and namespace equal the request's), then a
  // tail (see the header comment) unless `allow_tail` is false: then the
  // match is whole blocks only (a scope several tenants share).
  [[nodiscard]] PrefixMatch FindCachedPrefix(const TokenSequence& tokens,
                                             BlockHash ns,
                                             bool allow_tail = true) const;

  // Side-effect free: true iff AllocateWithPrefix(prefix, total_tokens)
  // would succeed for a request without a table and still leave at least
  // `watermark_blocks` free blocks (evictable cached blocks count as free,
  // except the matched ones it takes).
  [[nodiscard]] bool CanAllocateWithPrefix(const PrefixMatch& prefix,
                                           int64_t total_tokens,
                                           int32_t watermark_blocks) const;

  // Creates `request`'s table from `prefix` (cached -> active, active ->
  // active) and grows it to cover `total_tokens` with fresh blocks
  // (free -> active, or cached -> free -> active evicting the LRU head).
  // A tail's fresh block gets its content by a {tail, fresh} copy appended
  // to *copies; the tail block stays pinned until ReleasePinned.
  // Returns the fresh blocks; nullopt, changing nothing, when they do not
  // fit. Preconditions: `request` has no table; `prefix` comes from
  // FindCachedPrefix since the last mutating call; total_tokens >=
  // prefix.num_tokens (KV_CHECKed).
  [[nodiscard]] std::optional<std::vector<BlockId>> AllocateWithPrefix(
      RequestId request, const PrefixMatch& prefix, int64_t total_tokens,
      std::vector<BlockMove>* copies = nullptr);

  // Indexes `request`'s partially computed last block as a tail (see the
  // header comment): call it when the first num_computed_tokens of `tokens`
  // are written and the request is about to be freed. No-op when there is
  // no such block, when its earlier blocks are not all hashed, or when the
  // block is shared (another holder may still write it).
  void CachePartialBlock(RequestId request, const TokenSequence& tokens,
                         int32_t num_computed_tokens, BlockHash ns);

  // Unpins the tail blocks AllocateWithPrefix copied from. Call once the
  // copies it reported have been performed (the scheduler: at the start of
  // the next step).
  void ReleasePinned();

  // Registers the full blocks of `request` whose tokens are all computed
  // (the first num_computed_tokens of `tokens`) and not yet registered:
  // hashes them in order under `ns` and caches them (active, hashed; they
  // become cached -> evictable when freed). A block whose hash another block
  // already caches stays unhashed. No-op for a request without a table.
  void CacheComputedBlocks(RequestId request, const TokenSequence& tokens,
                           int32_t num_computed_tokens, BlockHash ns);

  // --- KV tiers ---------------------------------------------------------
  // Records every block CacheComputedBlocks registers from now on (off:
  // stops and drops the record).
  void set_record_newly_cached(bool on);
  // The blocks registered since the last call, in order.
  [[nodiscard]] std::vector<CachedBlockRecord> TakeNewlyCached();
  // For tier load `load`: holds the `matched` blocks (a FindCachedPrefix
  // match, so loading cannot evict them) and takes `n` fresh blocks to read
  // into, leaving at least `keep_free` free. Returns the fresh blocks;
  // nullopt, changing nothing, when they do not fit. Precondition: `load`
  // holds nothing.
  [[nodiscard]] std::optional<std::vector<BlockId>> ReserveForLoad(
      int64_t load, absl::Span<const BlockId> matched, int32_t n,
      int32_t keep_free);
  // Ends `load`: its first `verified` fresh blocks (full blocks of `tokens`,
  // block_size each, chained from `parent` under `ns`) are registered as
  // cached, as CacheComputedBlocks would (not recorded as newly cached);
  // the other fresh blocks are released. The matched and verified blocks
  // stay held under `load` until ReleaseLoad (so that nothing evicts them
  // before their request is admitted). A key another block already caches
  // leaves its block unregistered. Returns the blocks registered. No-op for
  // an unknown `load`.
  int32_t FinishLoad(int64_t load, int32_t verified, BlockHash parent,
                     BlockHash ns, absl::Span<const int32_t> tokens);
  // Releases every block `load` holds, the last first (cached ones become
  // evictable). No-op for an unknown `load`.
  void ReleaseLoad(int64_t load);
  // A purge: every unreferenced block whose content is findable (a cached
  // full block, or a tail) under a namespace `match` accepts stops being
  // findable. Blocks in use are left to their requests. Returns how many
  // were dropped. O(num_blocks).
  int32_t PurgeCached(absl::FunctionRef<bool(BlockHash ns)> match);
  [[nodiscard]] int32_t num_loads() const {
    return static_cast<int32_t>(loads_.size());
  }

  // Releases every block of `request`, tail-first (so its tail is evicted
  // before its head), and forgets its table; frees its swap slots if it is
  // swapped out. Returns the number of blocks in the table (0 for a request
  // without one; that is not an error).
  int32_t Free(RequestId request);

  // A bounded KV policy's drop (scheduler::KvWindow): removes entries
  // [first, first + count) of `request`'s table, releasing its reference to
  // each, the last first, as Free does (an unshared hashed block becomes
  // cached-evictable: its content was computed before anything was dropped,
  // so it is still what its key says). From then on the table registers
  // nothing (CacheComputedBlocks and CachePartialBlock skip it, and so do
  // the tables forked from it): KV computed after a drop depends on what
  // was dropped, so no other request may find it.
  // Preconditions: first >= 0, count >= 1, first + count < table size (the
  // block being written stays) (KV_CHECKed).
  void DropBlocks(RequestId request, int32_t first, int32_t count);

  // Speculative decoding's rollback: frees the entries of `request`'s table
  // past its first `num_blocks` (blocks allocated for draft tokens that
  // were rejected), the last first. They hold no computed token, so none is
  // hashed. Preconditions: num_blocks >= the table's hashed blocks; no-op
  // when the table holds no more than num_blocks (KV_CHECKed).
  void TrimBlocks(RequestId request, int32_t num_blocks);

  // Makes `child` share the first `num_blocks` of `parent`'s blocks (ref
  // count +1 each; -1: all of them). A partially filled last block is shared
  // too: AllocateForWrite copies it before the first write.
  // Preconditions: `parent` has a table of >= num_blocks >= 1 blocks (and
  // num_blocks covers its hashed blocks),
  // `child` has neither a table nor swap slots (KV_CHECKed).
  void Fork(RequestId parent, RequestId child, int32_t num_blocks = -1);

  // `request`'s table; empty when it has none. The reference is valid until
  // the next mutating call.
  [[nodiscard]] const std::vector<BlockId>& GetBlockTable(
      RequestId request) const;

  [[nodiscard]] KvUsage Usage() const;
  [[nodiscard]] int32_t block_size() const { return block_size_; }
  [[nodiscard]] int32_t num_blocks() const { return pool_.num_blocks(); }
  [[nodiscard]] int32_t num_free_blocks() const { return pool_.num_free(); }
  [[nodiscard]] int32_t num_requests() const {
    return static_cast<int32_t>(tables_.size());
  }
  [[nodiscard]] const BlockPool& pool() const { return pool_; }
  void set_eviction_observer(EvictionObserver observer);

  // --- KV events --------------------------------------------------------
  // Records every registration and loss of a full block's key from now on,
  // in order (off: stops and drops the record).
  void set_record_events(bool on);
  // The changes since the last call, in the order they happened.
  [[nodiscard]] std::vector<KvEvent> TakeEvents();
  // Every full block the prefix cache can find now: {key, namespace}, in
  // block id order. O(num_blocks).
  [[nodiscard]] std::vector<std::pair<BlockHash, BlockHash>> FindableBlocks()
      const;

  // Token slots written in active blocks, each block once however many
  // tables share it: a table's block i holds min(block_size, max(0,
  // computed(request) - i * block_size)) written tokens, the most any holder
  // has written; a pinned tail source holds its indexed tokens. Active
  // blocks * block_size minus this is the reserved-but-unwritten space.
  // O(total table entries).
  [[nodiscard]] int64_t WrittenSlots(
      absl::FunctionRef<int32_t(RequestId)> computed_tokens) const;

  // Verifies the invariants above; O(num_blocks + total table entries).
  [[nodiscard]] absl::Status CheckInvariants() const;

  // Makes the calling thread the owner that the mutating methods check
  // (debug builds); for a hand-off to another thread after first use.
  void BindOwnerThread() { owner_.Rebind(); }

 private:
  struct Table {
    std::vector<BlockId> blocks;
    // blocks[0, num_hashed) went through CacheComputedBlocks (or a prefix
    // hit); `last_hash` is the hash of blocks[num_hashed - 1].
    int32_t num_hashed = 0;
    BlockHash last_hash = kNoParentHash;
    // DropBlocks removed some of its blocks: it registers nothing more.
    bool dropped = false;
  };
  // pool_.Allocate, bumping each block's generation (its old content and
  // index entry become stale).
  [[nodiscard]] std::vector<BlockId> TakeFresh(int32_t n, EvictReason reason);
  // The best tail for the tokens [begin, begin + max_tokens) of `tokens`
  // after `parent`: sets match->tail_block/tail_tokens when one shares at
  // least one token.
  void FindTail(const TokenSequence& tokens, int32_t begin, int32_t max_tokens,
                BlockHash parent, BlockHash ns, PrefixMatch* match) const;

  BlockPool pool_;
  SwapSpace swap_;
  int32_t block_size_;
  BlockHashFn hash_fn_;
  absl::flat_hash_map<RequestId, Table> tables_;
  // Swapped-out requests: their slots, in table order.
  absl::flat_hash_map<RequestId, std::vector<SwapSlot>> swapped_;
  // What each block holds and the tail index (prefix_index.h).
  PrefixIndex index_;
  std::vector<BlockId> pinned_;  // tail sources of pending copies
  struct LoadHold {
    std::vector<BlockId> matched;
    std::vector<BlockId> fresh;
  };
  absl::flat_hash_map<int64_t, LoadHold> loads_;  // tier loads in flight
  bool record_newly_cached_ = false;
  std::vector<CachedBlockRecord> newly_cached_;
  bool record_events_ = false;
  std::vector<KvEvent> events_;
  EvictionObserver eviction_observer_;  // the caller's (metrics)
  ThreadOwner owner_;                   // the one thread that may mutate
};

}  // namespace kvserve::kvcache
