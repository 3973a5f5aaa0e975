// KvCacheManager: the policy layer over BlockPool. It owns one block table
// per request (an append-only list of block ids; token t of the request lives
// in block `table[t / block_size]`, slot `t % block_size`) and decides how
// many blocks a request needs. It does not own the KV bytes, knows nothing of
// scheduling order, and never fails on "doesn't fit": Allocate returns an
// empty optional and the scheduler reacts (preempts or waits).
//
// Invariants (CheckInvariants verifies them):
//   - the pool's invariants hold;
//   - every block's ref count equals the number of block tables holding it
//     (tables are the only owners of references);
//   - no table is empty (a request with no blocks has no table).
//
// Thread safety: none. Engine thread only.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "kvcache/block_pool.h"

namespace kvserve::kvcache {

// Scheduler-assigned request id (scheduler::RequestId is this type).
using RequestId = int64_t;

// KV occupancy in blocks. active + cached_evictable + free_uncached == total.
struct KvUsage {
  int32_t total_blocks = 0;
  int32_t free_blocks = 0;  // includes cached_evictable_blocks
  int32_t cached_evictable_blocks = 0;
  int32_t active_blocks = 0;
  // active_blocks / total_blocks, in [0, 1].
  double usage = 0.0;
};

class KvCacheManager {
 public:
  // Preconditions: num_blocks >= 1, block_size >= 1 (KV_CHECKed).
  KvCacheManager(int32_t num_blocks, int32_t block_size);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  // Blocks to add to `request`'s table for it to cover `num_tokens_total`
  // tokens: max(0, ceil(num_tokens_total / block_size) - table size).
  [[nodiscard]] int32_t NumBlocksNeeded(RequestId request,
                                        int64_t num_tokens_total) const;

  // Side-effect free: true iff Allocate(request, total_tokens) would succeed
  // and still leave at least `watermark_blocks` free blocks (evictable cached
  // blocks count as free). Always true when no block is needed.
  [[nodiscard]] bool CanAllocate(RequestId request, int64_t total_tokens,
                                 int32_t watermark_blocks) const;

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
  [[nodiscard]] std::optional<std::vector<BlockId>> Allocate(
      RequestId request, int64_t total_tokens);

  // Releases every block of `request`, tail-first (so its tail is evicted
  // before its head), and forgets its table. Returns the number of blocks
  // in the table (0 for a request without one; that is not an error).
  int32_t Free(RequestId request);

  // Makes `child` share all of `parent`'s blocks (ref count +1 each).
  // NOTE: a partially filled last block is shared too; writers must
  // copy-on-write it before appending (not handled here yet).
  // Preconditions: `parent` has a table, `child` has none (KV_CHECKed).
  void Fork(RequestId parent, RequestId child);

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

  // Verifies the invariants above; O(num_blocks + total table entries).
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  BlockPool pool_;
  int32_t block_size_;
  absl::flat_hash_map<RequestId, std::vector<BlockId>> tables_;
};

}  // namespace kvserve::kvcache
