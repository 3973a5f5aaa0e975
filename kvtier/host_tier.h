// HostTier: the index of a device backend's host KV cache (CUDA's pinned
// slots, engine/runner/host_kv_copier.h): which block each slot holds, with
// what it must verify against, in LRU order. The bytes are the backend's;
// this class only decides which slot is whose.
//
// A slot is free, pending (a copy into it is in flight: it is not a hit
// yet and cannot be evicted) or ready. A ready slot is pinned while a copy
// reads it; eviction takes the least recently used ready, unpinned slot.
// A hit checks the key, the parent, the namespace and the token ids, like
// every tier; a key whose entry disagrees is a counted miss and is freed.
//
// Engine thread only.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kvtier/block_codec.h"
#include "kvtier/tier.h"

namespace kvserve::kvtier {

class HostTier {
 public:
  struct Entry {
    Key key = 0;
    Key parent = 0;
    Key ns = 0;
    uint64_t scope_tag = 0;
    std::vector<int32_t> tokens;
  };

  HostTier(int32_t slots, uint64_t slot_bytes);

  // A slot for `e`, pending and pinned until Commit or Abandon: a free one,
  // else (with `evict`) the least recently used ready, unpinned one
  // (evicted, counted). nullopt when the key is held already or no slot is
  // free (counted as a dropped store when `evict`).
  [[nodiscard]] std::optional<int32_t> Reserve(Entry e, bool evict);
  // The copy into a reserved slot finished (and verified, for loads): it is
  // a ready block now, unpinned, most recently used.
  void Commit(int32_t slot);
  // The copy did not happen or did not verify: the slot is free again.
  void Abandon(int32_t slot);
  void DropStore(DropReason why) {
    ++stats_.stores_dropped[static_cast<int>(why)];
  }

  // The run of ready blocks for `keys` (a chain starting after `parent`),
  // whose token ids are `tokens` (block_size each, the first key's first),
  // from the first key on: their slots, each pinned (Unpin when its copy is
  // done) and made most recently used.
  [[nodiscard]] std::vector<int32_t> Probe(absl::Span<const Key> keys,
                                           Key parent, Key ns,
                                           absl::Span<const int32_t> tokens,
                                           int32_t block_size);
  void Pin(int32_t slot) { ++slots_[slot].pins; }
  void Unpin(int32_t slot);
  [[nodiscard]] bool Contains(Key key) const { return map_.contains(key); }
  // The ready entry of `slot` (a copy of what it holds goes to the lower
  // tiers).
  [[nodiscard]] const Entry& entry(int32_t slot) const {
    return slots_[slot].entry;
  }
  // Frees the ready, unpinned blocks whose scope tag (and namespace's salt
  // tag) match; nullopt matches any. Returns how many.
  int64_t Purge(std::optional<uint64_t> scope_tag,
                std::optional<uint64_t> salt_tag);

  // From now on, logs residency changes for TakeChanges (KV events): a
  // block that became ready, a ready block freed (evicted, purged or found
  // wrong).
  void RecordChanges() { record_changes_ = true; }
  [[nodiscard]] std::vector<TierChange> TakeChanges() {
    std::vector<TierChange> out;
    out.swap(changes_);
    return out;
  }

  [[nodiscard]] TierStats stats() const;
  // Every slot is in exactly one of: free list, pending, LRU; the map names
  // exactly the pending and ready slots.
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  enum class State { kFree, kPending, kReady };
  struct Slot {
    State state = State::kFree;
    int32_t pins = 0;
    Entry entry;
    std::list<int32_t>::iterator lru;  // valid when ready
  };
  void Free(int32_t slot);

  const uint64_t slot_bytes_;
  std::vector<Slot> slots_;
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;  // ready slots, least recently used first
  absl::flat_hash_map<Key, int32_t> map_;
  int64_t ready_ = 0;
  TierStats stats_;
  bool record_changes_ = false;
  std::vector<TierChange> changes_;
};

}  // namespace kvserve::kvtier
