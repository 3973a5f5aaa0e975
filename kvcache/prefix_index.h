// PrefixIndex: what each block of the pool holds, for prefix matching. For
// every block whose content is known (a hashed full block, or the indexed
// partial last block of a request that ended) it keeps the tokens, the
// parent hash and the namespace, checked on every hit (a hash match alone
// is never trusted), and an index of blocks by (parent hash, namespace), in
// which a cached tail is found: the block sharing the longest start with a
// request's next tokens. Owns no block and no reference; KvCacheManager
// decides what is indexed and when (kv_cache_manager.h).
//
// An entry is valid while its block has not been handed out since (a
// per-block generation, bumped by Invalidate, proves it); each block has at
// most one entry, so the index never exceeds the pool's block count.
// Erasing leaves a tombstone (O(1), keeps each list's order); a list is
// compacted when half of it is tombstones and dropped when all of it is.
//
// Thread safety: none (the KV manager's thread).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvcache/block_pool.h"

namespace kvserve::kvcache {

class PrefixIndex {
 public:
  PrefixIndex(int32_t num_blocks, int32_t block_size);

  // `block` is handed out again: its content and entry become stale.
  void Invalidate(BlockId block) { ++generation_[block]; }

  // Records that `block` holds `tokens` (at most block_size) after `parent`
  // under `ns`, replacing its previous entry.
  void Index(BlockId block, BlockHash parent, BlockHash ns,
             absl::Span<const int32_t> tokens);

  // Whether `block`'s recorded content is exactly (parent, ns, tokens).
  [[nodiscard]] bool Matches(BlockId block, BlockHash parent, BlockHash ns,
                             absl::Span<const int32_t> tokens) const;

  // Among the valid entries after (parent, ns), the newest kMaxCandidates
  // looked at: the block sharing the longest start with `want`, and how
  // many tokens it shares; {kNoBlock, 0} when none shares one.
  [[nodiscard]] std::pair<BlockId, int32_t> LongestStart(
      BlockHash parent, BlockHash ns, absl::Span<const int32_t> want) const;

  // The namespace of `block`'s entry while it is valid (not handed out
  // since it was indexed); nullopt otherwise.
  [[nodiscard]] std::optional<BlockHash> live_ns(BlockId block) const;

  // Tokens `block`'s entry holds (0: not indexed).
  [[nodiscard]] int32_t content_len(BlockId block) const {
    return content_len_[block];
  }

  // The index's invariants: each indexed block has exactly one live entry,
  // in the list of its own (parent, ns); tombstone counts are right.
  [[nodiscard]] absl::Status Check() const;

 private:
  // A popular prefix may have many children: look at the newest few.
  static constexpr int kMaxCandidates = 64;

  struct Content {
    BlockHash parent = 0;
    BlockHash ns = 0;
  };
  struct Key {
    BlockHash parent = 0;
    BlockHash ns = 0;
    bool operator==(const Key&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.parent, k.ns);
    }
  };
  struct Child {
    BlockId block = kNoBlock;  // kNoBlock: erased (a tombstone)
    uint32_t generation = 0;   // valid while generation_[block] equals it
  };
  struct ChildList {
    std::vector<Child> entries;  // oldest first
    int32_t dead = 0;
  };

  // Erases an indexed block's entry from its key's list.
  void Unindex(BlockId block);

  int32_t block_size_;
  std::vector<Content> content_;
  std::vector<int32_t> content_tokens_;  // [num_blocks][block_size]
  std::vector<int32_t> content_len_;     // 0: not indexed
  std::vector<uint32_t> generation_;
  absl::flat_hash_map<Key, ChildList> children_;
  // Per indexed block: its entry's position in its key's list.
  std::vector<int32_t> child_pos_;
};

}  // namespace kvserve::kvcache
