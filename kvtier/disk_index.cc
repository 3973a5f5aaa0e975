#include "kvtier/disk_index.h"

namespace kvserve::kvtier {

std::optional<BlockName> DiskIndex::Find(Key key) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return *it->second;
}

bool DiskIndex::Insert(const BlockName& name) {
  if (map_.contains(name.key)) return false;
  lru_.push_back(name);
  map_.emplace(name.key, std::prev(lru_.end()));
  return true;
}

bool DiskIndex::Touch(Key key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second);
  return true;
}

bool DiskIndex::Erase(Key key) {
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  lru_.erase(it->second);
  map_.erase(it);
  return true;
}

std::vector<BlockName> DiskIndex::TakeVictims(uint64_t limit) {
  std::vector<BlockName> out;
  while (!lru_.empty() && bytes() > limit) {
    out.push_back(lru_.front());
    map_.erase(lru_.front().key);
    lru_.pop_front();
  }
  return out;
}

std::vector<BlockName> DiskIndex::TakeIf(
    const std::function<bool(const BlockName&)>& match) {
  std::vector<BlockName> out;
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (match(*it)) {
      out.push_back(*it);
      map_.erase(it->key);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void DiskIndex::Clear() {
  lru_.clear();
  map_.clear();
}

}  // namespace kvserve::kvtier
