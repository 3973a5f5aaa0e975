#include "kvtier/host_tier.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kvtier/block_key.h"

namespace kvserve::kvtier {

HostTier::HostTier(int32_t slots, uint64_t slot_bytes)
    : slot_bytes_(slot_bytes), slots_(std::max(slots, 0)) {
  free_.reserve(slots_.size());
  for (int32_t s = static_cast<int32_t>(slots_.size()) - 1; s >= 0; --s) {
    free_.push_back(s);
  }
  stats_.capacity_bytes = slots_.size() * slot_bytes_;
}

std::optional<int32_t> HostTier::Reserve(Entry e, bool evict) {
  if (map_.contains(e.key)) return std::nullopt;
  int32_t s = -1;
  if (!free_.empty()) {
    s = free_.back();
    free_.pop_back();
  } else if (!evict) {
    return std::nullopt;
  } else {
    for (const int32_t c : lru_) {
      if (slots_[c].pins == 0) {
        s = c;
        break;
      }
    }
    if (s < 0) {
      ++stats_.stores_dropped[static_cast<int>(DropReason::kQueueFull)];
      return std::nullopt;
    }
    Free(s);
    ++stats_.evictions;
    free_.pop_back();  // Free pushed it
  }
  Slot& slot = slots_[s];
  slot.state = State::kPending;
  slot.pins = 1;
  map_[e.key] = s;
  slot.entry = std::move(e);
  return s;
}

void HostTier::Commit(int32_t s) {
  Slot& slot = slots_[s];
  if (slot.state != State::kPending) return;
  slot.state = State::kReady;
  slot.pins = 0;
  slot.lru = lru_.insert(lru_.end(), s);
  ++ready_;
  ++stats_.stores;
  if (record_changes_) {
    TierChange c;
    c.stored = true;
    c.header.key = slot.entry.key;
    c.header.parent = slot.entry.parent;
    c.header.ns = slot.entry.ns;
    c.header.tokens = slot.entry.tokens;
    changes_.push_back(std::move(c));
  }
}

void HostTier::Abandon(int32_t s) {
  if (slots_[s].state != State::kPending) return;
  Free(s);
}

void HostTier::Free(int32_t s) {
  Slot& slot = slots_[s];
  if (slot.state == State::kFree) return;
  if (slot.state == State::kReady) {
    lru_.erase(slot.lru);
    --ready_;
    if (record_changes_) {
      TierChange c;
      c.header.key = slot.entry.key;
      changes_.push_back(std::move(c));
    }
  }
  map_.erase(slot.entry.key);
  slot.state = State::kFree;
  slot.pins = 0;
  slot.entry = Entry{};
  free_.push_back(s);
}

std::vector<int32_t> HostTier::Probe(absl::Span<const Key> keys, Key parent,
                                     Key ns, absl::Span<const int32_t> tokens,
                                     int32_t block_size) {
  std::vector<int32_t> run;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = map_.find(keys[i]);
    if (it == map_.end() || slots_[it->second].state != State::kReady) {
      ++stats_.misses[static_cast<int>(MissReason::kAbsent)];
      break;
    }
    const int32_t s = it->second;
    Slot& slot = slots_[s];
    const auto want = tokens.subspan(i * block_size, block_size);
    if (slot.entry.parent != parent || slot.entry.ns != ns ||
        !std::equal(want.begin(), want.end(), slot.entry.tokens.begin(),
                    slot.entry.tokens.end())) {
      ++stats_.misses[static_cast<int>(MissReason::kTokens)];
      if (slot.pins == 0) Free(s);
      break;
    }
    ++slot.pins;
    lru_.splice(lru_.end(), lru_, slot.lru);
    ++stats_.hits;
    run.push_back(s);
    parent = keys[i];
  }
  return run;
}

void HostTier::Unpin(int32_t s) {
  if (slots_[s].pins > 0) --slots_[s].pins;
}

int64_t HostTier::Purge(std::optional<uint64_t> scope_tag,
                        std::optional<uint64_t> salt_tag) {
  std::vector<int32_t> doomed;
  for (const int32_t s : lru_) {
    const Entry& e = slots_[s].entry;
    if (slots_[s].pins != 0) continue;
    if (scope_tag.has_value() && e.scope_tag != *scope_tag) continue;
    if (salt_tag.has_value() && SaltTag(e.ns) != *salt_tag) continue;
    doomed.push_back(s);
  }
  for (const int32_t s : doomed) Free(s);
  return static_cast<int64_t>(doomed.size());
}

TierStats HostTier::stats() const {
  TierStats s = stats_;
  s.blocks = static_cast<uint64_t>(ready_);
  s.bytes = s.blocks * slot_bytes_;
  return s;
}

absl::Status HostTier::CheckInvariants() const {
  int64_t pending = 0;
  for (const Slot& s : slots_) pending += s.state == State::kPending;
  const auto n = static_cast<int64_t>(slots_.size());
  if (static_cast<int64_t>(free_.size()) + pending + ready_ != n ||
      static_cast<int64_t>(lru_.size()) != ready_ ||
      static_cast<int64_t>(map_.size()) != pending + ready_) {
    return absl::InternalError(
        absl::StrCat("host tier: ", free_.size(), " free + ", pending,
                     " pending + ", ready_, " ready of ", n, " slots; ",
                     lru_.size(), " in LRU, ", map_.size(), " keys"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::kvtier
