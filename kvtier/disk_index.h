// The disk tier's in-memory index: which blocks the directory holds, in
// least-recently-used order, and their bytes (every stored block of one
// format has the same size). Recency is the pool's own policy: prefix
// reuse follows conversations and shared system prompts, so the block used
// longest ago is the one least likely to be asked for; file mtimes carry
// it across restarts. Not thread-safe: DiskTier guards it.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvtier/block_key.h"

namespace kvserve::kvtier {

class DiskIndex {
 public:
  explicit DiskIndex(uint64_t entry_bytes) : entry_bytes_(entry_bytes) {}

  [[nodiscard]] bool Contains(Key key) const { return map_.contains(key); }
  [[nodiscard]] std::optional<BlockName> Find(Key key) const;
  // Adds `name` as the most recently used entry; false (and no change) if
  // its key is there already.
  bool Insert(const BlockName& name);
  // Makes `key` the most recently used; false if absent.
  bool Touch(Key key);
  bool Erase(Key key);
  // Removes and returns least recently used entries until bytes() <=
  // `limit`.
  [[nodiscard]] std::vector<BlockName> TakeVictims(uint64_t limit);
  // Removes and returns every entry `match` accepts.
  [[nodiscard]] std::vector<BlockName> TakeIf(
      const std::function<bool(const BlockName&)>& match);
  void Clear();

  [[nodiscard]] size_t size() const { return map_.size(); }
  [[nodiscard]] uint64_t bytes() const { return map_.size() * entry_bytes_; }
  [[nodiscard]] uint64_t entry_bytes() const { return entry_bytes_; }

 private:
  uint64_t entry_bytes_;
  std::list<BlockName> lru_;  // front: least recently used
  absl::flat_hash_map<Key, std::list<BlockName>::iterator> map_;
};

}  // namespace kvserve::kvtier
