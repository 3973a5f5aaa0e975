#include "kvcache/kv_cache_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::kvcache {
namespace {

KvEvent RemovedEvent(BlockHash key) {
  KvEvent e;
  e.kind = KvEvent::Kind::kRemoved;
  e.key = key;
  return e;
}

const std::vector<BlockId>& EmptyTable() {
  static const auto* const kEmpty = new std::vector<BlockId>();
  return *kEmpty;
}

}  // namespace

void TokenSequence::Copy(int32_t begin, int32_t n, int32_t* out) const {
  KV_DCHECK(begin >= 0 && n >= 0 && begin + n <= size());
  const auto prompt_len = static_cast<int32_t>(prompt.size());
  const int32_t end = begin + n;
  if (begin < prompt_len) {
    const int32_t stop = std::min(end, prompt_len);
    out = std::copy(prompt.begin() + begin, prompt.begin() + stop, out);
    begin = stop;
  }
  if (begin < end) {
    std::copy(output.begin() + (begin - prompt_len),
              output.begin() + (end - prompt_len), out);
  }
}

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size,
                               BlockHashFn hash_fn, int32_t num_swap_slots)
    : pool_(num_blocks),
      swap_(num_swap_slots),
      block_size_(block_size),
      hash_fn_(hash_fn),
      index_(num_blocks, block_size) {
  KV_CHECK(block_size >= 1, "block_size=", block_size);
  KV_CHECK(hash_fn != nullptr, "null hash_fn");
}

std::vector<BlockId> KvCacheManager::TakeFresh(int32_t n, EvictReason reason) {
  std::vector<BlockId> blocks = pool_.Allocate(n, reason);
  for (const BlockId b : blocks) index_.Invalidate(b);
  return blocks;
}

int32_t KvCacheManager::NumBlocksNeeded(RequestId request,
                                        int64_t num_tokens_total) const {
  const int64_t want = BlocksForTokens(num_tokens_total, block_size_);
  const int64_t have = static_cast<int64_t>(GetBlockTable(request).size());
  // NOTE: clamp before narrowing: a caller may ask about absurd lengths.
  return static_cast<int32_t>(std::clamp<int64_t>(want - have, 0, INT32_MAX));
}

std::optional<std::vector<BlockId>> KvCacheManager::Allocate(
    RequestId request, int64_t total_tokens, EvictReason reason) {
  owner_.CheckOwner("KvCacheManager");
  const int32_t needed = NumBlocksNeeded(request, total_tokens);
  if (needed > pool_.num_free()) return std::nullopt;
  if (needed == 0) return std::vector<BlockId>();
  std::vector<BlockId> fresh = TakeFresh(needed, reason);
  std::vector<BlockId>& table = tables_[request].blocks;
  table.insert(table.end(), fresh.begin(), fresh.end());
  return fresh;
}

bool KvCacheManager::AllocateForWrite(RequestId request,
                                      int32_t num_computed_tokens,
                                      int64_t total_tokens,
                                      std::vector<BlockMove>* copies) {
  owner_.CheckOwner("KvCacheManager");
  auto it = tables_.find(request);
  const int64_t have =
      it == tables_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  const int64_t fresh =
      std::max<int64_t>(0, BlocksForTokens(total_tokens, block_size_) - have);
  const int64_t idx = num_computed_tokens / block_size_;
  const bool cow = idx < have && pool_.ref_count(it->second.blocks[idx]) > 1;
  if (fresh + (cow ? 1 : 0) > pool_.num_free()) return false;
  if (fresh == 0 && !cow) return true;
  KV_CHECK(swapped_.find(request) == swapped_.end(), "request ", request,
           " writes while swapped out");
  Table& table = it == tables_.end() ? tables_[request] : it->second;
  if (cow) {
    // Only a block not yet full of computed tokens is ever written, and
    // such a block is never hashed.
    KV_DCHECK(idx >= table.num_hashed);
    BlockId& entry = table.blocks[idx];
    const BlockId old = entry;
    entry = TakeFresh(1, EvictReason::kCopyOnWrite).front();  // -> active
    copies->push_back({old, entry});
    pool_.Free(absl::MakeConstSpan(&old, 1));  // active (ref - 1), intact
  }
  if (fresh > 0) {
    const std::vector<BlockId> blocks =
        TakeFresh(static_cast<int32_t>(fresh), EvictReason::kGrow);
    table.blocks.insert(table.blocks.end(), blocks.begin(), blocks.end());
  }
  return true;
}

bool KvCacheManager::CanSwapOut(RequestId request, int32_t num_blocks) const {
  return num_blocks >= 0 && swap_.num_free() >= num_blocks &&
         static_cast<int64_t>(GetBlockTable(request).size()) >= num_blocks &&
         !swapped_.contains(request);
}

void KvCacheManager::SwapOut(RequestId request, int32_t num_blocks,
                             std::vector<BlockMove>* moves) {
  owner_.CheckOwner("KvCacheManager");
  KV_CHECK(CanSwapOut(request, num_blocks), "request ", request,
           " cannot swap out ", num_blocks, " blocks (free slots ",
           swap_.num_free(), ")");
  const std::vector<BlockId>& table = GetBlockTable(request);
  std::vector<SwapSlot> slots = swap_.Allocate(num_blocks);
  for (int32_t i = 0; i < num_blocks; ++i) {
    moves->push_back({table[i], slots[i]});
  }
  Free(request);  // active -> cached | free; contents intact until reused
  if (!slots.empty()) swapped_.emplace(request, std::move(slots));
}

bool KvCacheManager::SwapIn(RequestId request, std::vector<BlockMove>* moves) {
  owner_.CheckOwner("KvCacheManager");
  auto it = swapped_.find(request);
  KV_CHECK(it != swapped_.end(), "request ", request, " is not swapped out");
  KV_CHECK(!tables_.contains(request), "request ", request, " has blocks");
  const std::vector<SwapSlot>& slots = it->second;
  const auto n = static_cast<int32_t>(slots.size());
  if (n > pool_.num_free()) return false;
  Table& table = tables_[request];
  table.blocks = TakeFresh(n, EvictReason::kSwapIn);  // free -> active
  for (int32_t i = 0; i < n; ++i) moves->push_back({slots[i], table.blocks[i]});
  swap_.Free(slots);
  swapped_.erase(it);
  return true;
}

int32_t KvCacheManager::num_swapped_blocks(RequestId request) const {
  auto it = swapped_.find(request);
  return it == swapped_.end() ? 0 : static_cast<int32_t>(it->second.size());
}

PrefixMatch KvCacheManager::FindCachedPrefix(const TokenSequence& tokens,
                                             BlockHash ns,
                                             bool allow_tail) const {
  PrefixMatch match;
  // NOTE: the last token is always recomputed: its logits are needed.
  const int32_t max_blocks = std::max(0, tokens.size() - 1) / block_size_;
  std::vector<int32_t> block_tokens(block_size_);
  BlockHash parent = kNoParentHash;
  for (int32_t i = 0; i < max_blocks; ++i) {
    tokens.Copy(i * block_size_, block_size_, block_tokens.data());
    const BlockHash hash = hash_fn_(parent, ns, block_tokens);
    const std::optional<BlockId> block = pool_.GetCachedBlock(hash);
    if (!block.has_value() ||
        !index_.Matches(*block, parent, ns, block_tokens)) {
      break;
    }
    match.blocks.push_back(*block);
    if (pool_.ref_count(*block) == 0) ++match.num_evictable;
    parent = hash;
  }
  match.num_tokens = static_cast<int32_t>(match.blocks.size()) * block_size_;
  const int32_t rest =
      std::min(block_size_ - 1, tokens.size() - 1 - match.num_tokens);
  if (rest > 0 && allow_tail) {
    FindTail(tokens, match.num_tokens, rest, parent, ns, &match);
  }
  return match;
}

void KvCacheManager::FindTail(const TokenSequence& tokens, int32_t begin,
                              int32_t max_tokens, BlockHash parent,
                              BlockHash ns, PrefixMatch* match) const {
  std::vector<int32_t> want(max_tokens);
  tokens.Copy(begin, max_tokens, want.data());
  const auto [block, shared] = index_.LongestStart(parent, ns, want);
  if (shared == 0) return;
  match->tail_block = block;
  match->tail_tokens = shared;
  match->num_tokens += shared;
  if (pool_.ref_count(block) == 0) ++match->num_evictable;
}

bool KvCacheManager::CanAllocateWithPrefix(const PrefixMatch& prefix,
                                           int64_t total_tokens,
                                           int32_t watermark_blocks) const {
  const int64_t fresh =
      std::max<int64_t>(0, BlocksForTokens(total_tokens, block_size_) -
                               static_cast<int64_t>(prefix.blocks.size()));
  const int64_t taken = fresh + prefix.num_evictable;
  if (taken == 0) return true;
  return int64_t{pool_.num_free()} - taken >= watermark_blocks;
}

std::optional<std::vector<BlockId>> KvCacheManager::AllocateWithPrefix(
    RequestId request, const PrefixMatch& prefix, int64_t total_tokens,
    std::vector<BlockMove>* copies) {
  owner_.CheckOwner("KvCacheManager");
  KV_CHECK(!tables_.contains(request), "request ", request, " has blocks");
  KV_CHECK(total_tokens >= prefix.num_tokens, "total_tokens=", total_tokens,
           " < cached ", prefix.num_tokens);
  const auto matched = static_cast<int64_t>(prefix.blocks.size());
  const int64_t fresh_needed = std::max<int64_t>(
      0, BlocksForTokens(total_tokens, block_size_) - matched);
  if (fresh_needed + prefix.num_evictable > pool_.num_free()) {
    return std::nullopt;
  }
  if (matched == 0 && fresh_needed == 0) return std::vector<BlockId>();
  const bool tail = prefix.tail_block != kNoBlock;
  KV_CHECK(!tail || (fresh_needed >= 1 && copies != nullptr),
           "a tail hit needs a block and a copy list");
  // Touch first: the matched evictable blocks leave the free queue before
  // Allocate pops (and may evict) from its head.
  pool_.Touch(prefix.blocks);  // cached -> active | active -> active
  pool_.RecordHits(prefix.blocks);
  if (tail) {
    pool_.Pin(prefix.tail_block);
    pinned_.push_back(prefix.tail_block);
  }
  std::vector<BlockId> fresh =
      TakeFresh(static_cast<int32_t>(fresh_needed), EvictReason::kAdmit);
  if (tail) copies->push_back({prefix.tail_block, fresh.front()});
  Table& table = tables_[request];
  table.blocks = prefix.blocks;
  table.blocks.insert(table.blocks.end(), fresh.begin(), fresh.end());
  table.num_hashed = static_cast<int32_t>(matched);
  if (matched > 0) {
    // A matched block is a cached one: it has its hash.
    const std::optional<BlockHash> last =
        pool_.block_hash(prefix.blocks.back());
    KV_DCHECK(last.has_value());
    if (last.has_value()) table.last_hash = *last;
  }
  return fresh;
}

void KvCacheManager::CacheComputedBlocks(RequestId request,
                                         const TokenSequence& tokens,
                                         int32_t num_computed_tokens,
                                         BlockHash ns) {
  owner_.CheckOwner("KvCacheManager");
  auto it = tables_.find(request);
  if (it == tables_.end()) return;
  Table& table = it->second;
  if (table.dropped) return;
  const int32_t full = std::min<int32_t>(
      std::min(num_computed_tokens, tokens.size()) / block_size_,
      static_cast<int32_t>(table.blocks.size()));
  if (table.num_hashed >= full) return;
  std::vector<int32_t> block_tokens(block_size_);
  for (int32_t i = table.num_hashed; i < full; ++i) {
    const BlockId block = table.blocks[i];
    tokens.Copy(i * block_size_, block_size_, block_tokens.data());
    const BlockHash hash = hash_fn_(table.last_hash, ns, block_tokens);
    // A shared block may already carry this hash (a prefix hit).
    if (!pool_.block_hash(block).has_value() && pool_.CacheBlock(block, hash)) {
      // active -> active (hashed): remember what it holds for hit checks.
      index_.Index(block, table.last_hash, ns, block_tokens);
      if (record_newly_cached_) {
        newly_cached_.push_back(
            {block, hash, table.last_hash, ns, block_tokens});
      }
      if (record_events_) {
        events_.push_back(
            {KvEvent::Kind::kStored, hash, table.last_hash, ns, block_tokens});
      }
    }
    table.last_hash = hash;
    table.num_hashed = i + 1;
  }
}

void KvCacheManager::CachePartialBlock(RequestId request,
                                       const TokenSequence& tokens,
                                       int32_t num_computed_tokens,
                                       BlockHash ns) {
  owner_.CheckOwner("KvCacheManager");
  auto it = tables_.find(request);
  if (it == tables_.end()) return;
  const Table& table = it->second;
  if (table.dropped) return;
  const int32_t computed = std::min(num_computed_tokens, tokens.size());
  const int32_t idx = computed / block_size_;
  const int32_t len = computed - idx * block_size_;
  if (len == 0 || idx != table.num_hashed ||
      idx >= static_cast<int32_t>(table.blocks.size())) {
    return;
  }
  const BlockId block = table.blocks[idx];
  if (pool_.ref_count(block) != 1 || pool_.block_hash(block).has_value()) {
    return;
  }
  std::vector<int32_t> block_tokens(len);
  tokens.Copy(idx * block_size_, len, block_tokens.data());
  index_.Index(block, table.last_hash, ns, block_tokens);
}

void KvCacheManager::set_record_newly_cached(bool on) {
  record_newly_cached_ = on;
  if (!on) newly_cached_.clear();
}

void KvCacheManager::set_eviction_observer(EvictionObserver observer) {
  eviction_observer_ = std::move(observer);
  if (!eviction_observer_ && !record_events_) {
    pool_.set_eviction_observer(nullptr);
    return;
  }
  pool_.set_eviction_observer([this](const Eviction& e) {
    if (record_events_) events_.push_back(RemovedEvent(e.hash));
    if (eviction_observer_) eviction_observer_(e);
  });
}

void KvCacheManager::set_record_events(bool on) {
  record_events_ = on;
  if (!on) events_.clear();
  set_eviction_observer(std::move(eviction_observer_));
}

std::vector<KvEvent> KvCacheManager::TakeEvents() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

std::vector<std::pair<BlockHash, BlockHash>> KvCacheManager::FindableBlocks()
    const {
  std::vector<std::pair<BlockHash, BlockHash>> out;
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    const std::optional<BlockHash> key = pool_.block_hash(b);
    const std::optional<BlockHash> ns = index_.live_ns(b);
    if (key.has_value() && ns.has_value() &&
        index_.content_len(b) == block_size_) {
      out.emplace_back(*key, *ns);
    }
  }
  return out;
}

std::vector<CachedBlockRecord> KvCacheManager::TakeNewlyCached() {
  std::vector<CachedBlockRecord> out;
  out.swap(newly_cached_);
  return out;
}

std::optional<std::vector<BlockId>> KvCacheManager::ReserveForLoad(
    int64_t load, absl::Span<const BlockId> matched, int32_t n,
    int32_t keep_free) {
  owner_.CheckOwner("KvCacheManager");
  KV_CHECK(!loads_.contains(load), "tier load ", load, " exists");
  int32_t evictable = 0;
  for (const BlockId b : matched) {
    if (pool_.ref_count(b) == 0) ++evictable;
  }
  if (n <= 0 ||
      int64_t{pool_.num_free()} - evictable - n < int64_t{keep_free}) {
    return std::nullopt;
  }
  // Touch first: the matched blocks leave the free queue before TakeFresh
  // pops (and may evict) from its head.
  pool_.Touch(matched);
  LoadHold& hold = loads_[load];
  hold.matched.assign(matched.begin(), matched.end());
  hold.fresh = TakeFresh(n, EvictReason::kAdmit);
  return hold.fresh;
}

int32_t KvCacheManager::FinishLoad(int64_t load, int32_t verified,
                                   BlockHash parent, BlockHash ns,
                                   absl::Span<const int32_t> tokens) {
  owner_.CheckOwner("KvCacheManager");
  auto it = loads_.find(load);
  if (it == loads_.end()) return 0;
  LoadHold& hold = it->second;
  verified =
      std::clamp<int32_t>(verified, 0, static_cast<int32_t>(hold.fresh.size()));
  KV_CHECK(tokens.size() >= static_cast<size_t>(verified) * block_size_,
           "FinishLoad: ", tokens.size(), " tokens for ", verified, " blocks");
  int32_t registered = 0;
  for (int32_t i = 0; i < verified; ++i) {
    const absl::Span<const int32_t> bt =
        tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const BlockHash hash = hash_fn_(parent, ns, bt);
    if (pool_.CacheBlock(hold.fresh[i], hash)) {
      index_.Index(hold.fresh[i], parent, ns, bt);
      ++registered;
      if (record_events_) {
        events_.push_back({KvEvent::Kind::kStored, hash, parent, ns,
                           std::vector<int32_t>(bt.begin(), bt.end())});
      }
    }
    parent = hash;
  }
  // What did not verify holds garbage: free (unhashed) now, last first.
  std::vector<BlockId> unverified(hold.fresh.begin() + verified,
                                  hold.fresh.end());
  std::reverse(unverified.begin(), unverified.end());
  pool_.Free(unverified);
  hold.fresh.resize(verified);
  return registered;
}

int32_t KvCacheManager::PurgeCached(
    absl::FunctionRef<bool(BlockHash ns)> match) {
  int32_t dropped = 0;
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (pool_.ref_count_unchecked(b) != 0) continue;
    const std::optional<BlockHash> ns = index_.live_ns(b);
    if (!ns.has_value() || !match(*ns)) continue;
    const std::optional<BlockHash> key = pool_.block_hash(b);
    if (pool_.Uncache(b) && record_events_ && key.has_value()) {
      events_.push_back(RemovedEvent(*key));
    }
    index_.Invalidate(b);
    ++dropped;
  }
  return dropped;
}

void KvCacheManager::ReleaseLoad(int64_t load) {
  owner_.CheckOwner("KvCacheManager");
  auto it = loads_.find(load);
  if (it == loads_.end()) return;
  // Last first, as Free does: a chain's tail is evicted before its head.
  std::vector<BlockId> release = std::move(it->second.matched);
  release.insert(release.end(), it->second.fresh.begin(),
                 it->second.fresh.end());
  loads_.erase(it);
  std::reverse(release.begin(), release.end());
  pool_.Free(release);
}

void KvCacheManager::ReleasePinned() {
  owner_.CheckOwner("KvCacheManager");
  if (pinned_.empty()) return;
  pool_.Free(pinned_);
  pinned_.clear();
}

int32_t KvCacheManager::Free(RequestId request) {
  owner_.CheckOwner("KvCacheManager");
  if (!swapped_.empty()) {
    if (auto sw = swapped_.find(request); sw != swapped_.end()) {
      swap_.Free(sw->second);
      swapped_.erase(sw);
    }
  }
  auto it = tables_.find(request);
  if (it == tables_.end()) return 0;
  std::vector<BlockId>& table = it->second.blocks;
  const auto n = static_cast<int32_t>(table.size());
  std::reverse(table.begin(), table.end());  // tail-first: tails evict first
  pool_.Free(table);
  tables_.erase(it);
  return n;
}

void KvCacheManager::DropBlocks(RequestId request, int32_t first,
                                int32_t count) {
  owner_.CheckOwner("KvCacheManager");
  auto it = tables_.find(request);
  KV_CHECK(it != tables_.end(), "drop from request ", request,
           " without blocks");
  Table& table = it->second;
  const auto size = static_cast<int32_t>(table.blocks.size());
  KV_CHECK(first >= 0 && count >= 1 && first + count < size, "drop of ", count,
           " blocks at ", first, " from a table of ", size);
  const auto begin = table.blocks.begin() + first;
  std::vector<BlockId> gone(begin, begin + count);
  table.blocks.erase(begin, begin + count);
  table.num_hashed = std::min(table.num_hashed, first);
  table.dropped = true;
  std::reverse(gone.begin(), gone.end());
  pool_.Free(gone);
}

void KvCacheManager::TrimBlocks(RequestId request, int32_t num_blocks) {
  owner_.CheckOwner("KvCacheManager");
  auto it = tables_.find(request);
  if (it == tables_.end()) return;
  Table& table = it->second;
  const auto size = static_cast<int32_t>(table.blocks.size());
  if (size <= num_blocks) return;
  KV_CHECK(num_blocks >= table.num_hashed, "trim of request ", request, " to ",
           num_blocks, " blocks below its ", table.num_hashed, " hashed ones");
  std::vector<BlockId> gone(table.blocks.begin() + num_blocks,
                            table.blocks.end());
  table.blocks.resize(num_blocks);
  std::reverse(gone.begin(), gone.end());
  pool_.Free(gone);
}

void KvCacheManager::Fork(RequestId parent, RequestId child,
                          int32_t num_blocks) {
  owner_.CheckOwner("KvCacheManager");
  KV_CHECK(parent != child, "fork onto itself: ", parent);
  auto it = tables_.find(parent);
  KV_CHECK(it != tables_.end(), "fork of request ", parent, " without blocks");
  KV_CHECK(!tables_.contains(child) && !swapped_.contains(child), "fork child ",
           child, " has blocks or swap slots");
  Table copy = it->second;  // `it` dies on insertion
  if (num_blocks >= 0) {
    KV_CHECK(num_blocks >= 1 &&
                 num_blocks <= static_cast<int32_t>(copy.blocks.size()),
             "fork of ", num_blocks, " blocks of ", copy.blocks.size());
    // Hashed blocks hold computed tokens, which a fork always shares.
    KV_CHECK(num_blocks >= copy.num_hashed, "fork of ", num_blocks,
             " blocks drops hashed ones (", copy.num_hashed, ")");
    copy.blocks.resize(num_blocks);
  }
  pool_.Touch(copy.blocks);
  tables_.emplace(child, std::move(copy));
}

int64_t KvCacheManager::WrittenSlots(
    absl::FunctionRef<int32_t(RequestId)> computed_tokens) const {
  int64_t written = 0;
  // Shared blocks: the most any holder wrote, counted once.
  absl::flat_hash_map<BlockId, int32_t> shared;
  const int64_t bs = block_size_;
  for (const auto& [id, table] : tables_) {
    const int64_t computed = computed_tokens(id);
    const auto size = static_cast<int64_t>(table.blocks.size());
    // Blocks past the computed tokens hold nothing, shared or not.
    const int64_t touched = std::min(size, (computed + bs - 1) / bs);
    for (int64_t i = 0; i < touched; ++i) {
      const auto n = static_cast<int32_t>(std::min(bs, computed - i * bs));
      const BlockId b = table.blocks[i];
      if (pool_.ref_count_unchecked(b) == 1) {
        written += n;
      } else {
        int32_t& most = shared[b];
        most = std::max(most, n);
      }
    }
  }
  for (const BlockId b : pinned_) {
    int32_t& most = shared[b];
    most = std::max(most, index_.content_len(b));
  }
  for (const auto& [b, n] : shared) written += n;
  return written;
}

const std::vector<BlockId>& KvCacheManager::GetBlockTable(
    RequestId request) const {
  auto it = tables_.find(request);
  return it == tables_.end() ? EmptyTable() : it->second.blocks;
}

KvUsage KvCacheManager::Usage() const {
  KvUsage u;
  u.total_blocks = pool_.num_blocks();
  u.free_blocks = pool_.num_free();
  u.cached_evictable_blocks = pool_.num_cached_evictable();
  u.active_blocks = pool_.num_active();
  u.usage = static_cast<double>(u.active_blocks) / u.total_blocks;
  u.swap_slots_total = swap_.num_slots();
  u.swap_slots_used = swap_.num_used();
  return u;
}

absl::Status KvCacheManager::CheckInvariants() const {
  if (absl::Status s = pool_.CheckInvariants(); !s.ok()) return s;
  std::vector<int32_t> holders(pool_.num_blocks(), 0);
  for (const auto& [id, t] : tables_) {
    const std::vector<BlockId>& table = t.blocks;
    if (table.empty()) {
      return absl::InternalError(absl::StrCat("request ", id, " empty table"));
    }
    if (t.num_hashed < 0 || t.num_hashed > static_cast<int32_t>(table.size())) {
      return absl::InternalError(absl::StrCat(
          "request ", id, " hashed ", t.num_hashed, " of ", table.size()));
    }
    for (const BlockId b : table) {
      if (b < 0 || b >= pool_.num_blocks()) {
        return absl::InternalError(
            absl::StrCat("request ", id, " holds bad block ", b));
      }
      ++holders[b];
    }
  }
  for (const BlockId b : pinned_) ++holders[b];
  for (const auto& [id, hold] : loads_) {
    for (const BlockId b : hold.matched) ++holders[b];
    for (const BlockId b : hold.fresh) ++holders[b];
  }
  KV_RETURN_IF_ERROR(swap_.CheckInvariants());
  std::vector<bool> slot_held(swap_.num_slots(), false);
  int32_t slots_held = 0;
  for (const auto& [id, slots] : swapped_) {
    if (slots.empty() || tables_.contains(id)) {
      return absl::InternalError(absl::StrCat(
          "swapped request ", id, " holds ", slots.size(), " slots",
          tables_.contains(id) ? " and a block table" : ""));
    }
    for (const SwapSlot s : slots) {
      if (s < 0 || s >= swap_.num_slots() || swap_.is_free(s) || slot_held[s]) {
        return absl::InternalError(
            absl::StrCat("request ", id, " holds bad swap slot ", s));
      }
      slot_held[s] = true;
      ++slots_held;
    }
  }
  if (slots_held != swap_.num_used()) {
    return absl::InternalError(absl::StrCat(slots_held, " swap slots held, ",
                                            swap_.num_used(), " used"));
  }
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (holders[b] != pool_.ref_count(b)) {
      return absl::InternalError(
          absl::StrCat("block ", b, " ref=", pool_.ref_count(b), " but ",
                       holders[b], " tables hold it"));
    }
  }
  return index_.Check();
}

}  // namespace kvserve::kvcache
