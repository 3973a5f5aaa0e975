#include "kvcache/prefix_index.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvserve::kvcache {

PrefixIndex::PrefixIndex(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      content_(num_blocks),
      content_tokens_(static_cast<size_t>(num_blocks) * block_size),
      content_len_(num_blocks, 0),
      generation_(num_blocks, 0),
      child_pos_(num_blocks, -1) {}

void PrefixIndex::Unindex(BlockId block) {
  const Content& old = content_[block];
  auto it = children_.find(Key{old.parent, old.ns});
  if (it == children_.end()) return;
  ChildList& list = it->second;
  const int32_t pos = child_pos_[block];
  if (pos < 0 || pos >= static_cast<int32_t>(list.entries.size()) ||
      list.entries[pos].block != block) {
    return;
  }
  list.entries[pos].block = kNoBlock;
  const auto size = static_cast<int32_t>(list.entries.size());
  if (++list.dead == size) {
    children_.erase(it);
    return;
  }
  if (2 * list.dead <= size) return;
  std::erase_if(list.entries,
                [](const Child& c) { return c.block == kNoBlock; });
  list.dead = 0;
  for (size_t i = 0; i < list.entries.size(); ++i) {
    child_pos_[list.entries[i].block] = static_cast<int32_t>(i);
  }
}

void PrefixIndex::Index(BlockId block, BlockHash parent, BlockHash ns,
                        absl::Span<const int32_t> tokens) {
  if (content_len_[block] > 0) Unindex(block);
  std::copy(tokens.begin(), tokens.end(),
            content_tokens_.begin() + static_cast<size_t>(block) * block_size_);
  content_[block] = {parent, ns};
  content_len_[block] = static_cast<int32_t>(tokens.size());
  std::vector<Child>& entries = children_[Key{parent, ns}].entries;
  child_pos_[block] = static_cast<int32_t>(entries.size());
  entries.push_back({block, generation_[block]});
}

bool PrefixIndex::Matches(BlockId block, BlockHash parent, BlockHash ns,
                          absl::Span<const int32_t> tokens) const {
  const Content& c = content_[block];
  if (c.parent != parent || c.ns != ns) return false;
  const int32_t* stored =
      content_tokens_.data() + static_cast<size_t>(block) * block_size_;
  return std::equal(tokens.begin(), tokens.end(), stored);
}

std::optional<BlockHash> PrefixIndex::live_ns(BlockId block) const {
  if (content_len_[block] == 0) return std::nullopt;
  const Content& c = content_[block];
  auto it = children_.find(Key{c.parent, c.ns});
  if (it == children_.end()) return std::nullopt;
  const Child& child = it->second.entries[child_pos_[block]];
  if (child.block != block || child.generation != generation_[block]) {
    return std::nullopt;
  }
  return c.ns;
}

std::pair<BlockId, int32_t> PrefixIndex::LongestStart(
    BlockHash parent, BlockHash ns, absl::Span<const int32_t> want) const {
  auto it = children_.find(Key{parent, ns});
  if (it == children_.end()) return {kNoBlock, 0};
  const auto max_tokens = static_cast<int32_t>(want.size());
  int32_t best = 0;
  BlockId best_block = kNoBlock;
  int looked = 0;
  const std::vector<Child>& entries = it->second.entries;
  for (auto c = entries.rbegin();
       c != entries.rend() && looked < kMaxCandidates && best < max_tokens;
       ++c) {
    if (c->block == kNoBlock) continue;                    // erased
    if (generation_[c->block] != c->generation) continue;  // reallocated
    ++looked;
    const int32_t n = std::min(content_len_[c->block], max_tokens);
    const int32_t* stored =
        content_tokens_.data() + static_cast<size_t>(c->block) * block_size_;
    const auto common = static_cast<int32_t>(
        std::mismatch(want.begin(), want.begin() + n, stored).first -
        want.begin());
    if (common > best) {
      best = common;
      best_block = c->block;
    }
  }
  return {best_block, best};
}

absl::Status PrefixIndex::Check() const {
  int64_t live = 0;
  for (const auto& [key, list] : children_) {
    int32_t dead = 0;
    for (size_t i = 0; i < list.entries.size(); ++i) {
      const BlockId b = list.entries[i].block;
      if (b == kNoBlock) {
        ++dead;
        continue;
      }
      if (content_len_[b] == 0 || child_pos_[b] != static_cast<int32_t>(i) ||
          !(Key{content_[b].parent, content_[b].ns} == key)) {
        return absl::InternalError(absl::StrCat("block ", b, " indexed at ", i,
                                                " of a list it is not in"));
      }
      ++live;
    }
    if (dead != list.dead ||
        2 * dead > static_cast<int32_t>(list.entries.size())) {
      return absl::InternalError(absl::StrCat("a child list of ",
                                              list.entries.size(), " counts ",
                                              list.dead, " erased of ", dead));
    }
  }
  const auto indexed = std::count_if(content_len_.begin(), content_len_.end(),
                                     [](int32_t n) { return n > 0; });
  if (live != indexed) {
    return absl::InternalError(
        absl::StrCat(indexed, " blocks indexed, ", live, " child entries"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::kvcache
