#include "models/tokenizer/bpe.h"

#include <algorithm>

#include "models/tokenizer/utf8.h"

namespace kvserve::models {
namespace {

// Heap orders: the best candidate sits at heap.front().
struct RankWorse {
  bool operator()(const BpeRankMerger::Scratch::Candidate& a,
                  const BpeRankMerger::Scratch::Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }
};

struct ScoreWorse {
  bool operator()(const SpmScoreMerger::Scratch::Candidate& a,
                  const SpmScoreMerger::Scratch::Candidate& b) const {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  }
};

}  // namespace

void BpeRankMerger::Add(int32_t left, int32_t right, int32_t result,
                        int32_t rank) {
  merges_.try_emplace(Key(left, right), MergeInfo{rank, result});
}

void BpeRankMerger::Push(const Scratch::Symbol* symbols, int32_t left,
                         int32_t right, Scratch* scratch) const {
  const int32_t left_id = symbols[left].id;
  const int32_t right_id = symbols[right].id;
  const auto it = merges_.find(Key(left_id, right_id));
  if (it == merges_.end()) return;
  scratch->heap.push_back(
      {it->second.rank, left, right, left_id, right_id, it->second.result});
  std::push_heap(scratch->heap.begin(), scratch->heap.end(), RankWorse());
}

void BpeRankMerger::Merge(const std::vector<int32_t>& ids, Scratch* scratch,
                          std::vector<int32_t>* out) const {
  const int32_t n = static_cast<int32_t>(ids.size());
  if (n <= 1) {
    out->insert(out->end(), ids.begin(), ids.end());
    return;
  }
  auto& sym = scratch->symbols;
  sym.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = {ids[i], i - 1, i + 1 < n ? i + 1 : -1};
  }
  scratch->heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) Push(sym.data(), i, i + 1, scratch);

  constexpr int32_t kDead = -2;
  while (!scratch->heap.empty()) {
    std::pop_heap(scratch->heap.begin(), scratch->heap.end(), RankWorse());
    const Scratch::Candidate c = scratch->heap.back();
    scratch->heap.pop_back();
    // Stale if either side changed since the pair was pushed: a symbol's id
    // only changes by growing, so equal ids at the same indices mean the
    // same pair.
    if (sym[c.left].id != c.left_id || sym[c.left].next != c.right ||
        sym[c.right].id != c.right_id) {
      continue;
    }
    Scratch::Symbol& left = sym[c.left];
    left.id = c.result;
    left.next = sym[c.right].next;
    if (left.next >= 0) sym[left.next].prev = c.left;
    sym[c.right].id = kDead;
    if (left.prev >= 0) Push(sym.data(), left.prev, c.left, scratch);
    if (left.next >= 0) Push(sym.data(), c.left, left.next, scratch);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) out->push_back(sym[i].id);
}

void SpmScoreMerger::Push(std::string_view text, const Scratch::Symbol* symbols,
                          int32_t left, int32_t right, Scratch* scratch) const {
  if (left < 0 || right < 0) return;
  const uint32_t begin = symbols[left].begin;
  const uint32_t size = symbols[left].size + symbols[right].size;
  const auto it = vocab_->find(AbslView(text.substr(begin, size)));
  if (it == vocab_->end()) return;
  const float score = static_cast<size_t>(it->second) < scores_->size()
                          ? (*scores_)[it->second]
                          : 0.0f;
  scratch->heap.push_back({score, left, right, size});
  std::push_heap(scratch->heap.begin(), scratch->heap.end(), ScoreWorse());
}

void SpmScoreMerger::Merge(
    std::string_view text, Scratch* scratch,
    std::vector<std::pair<uint32_t, uint32_t>>* pieces) const {
  auto& sym = scratch->symbols;
  sym.clear();
  for (uint32_t pos = 0; pos < text.size();) {
    const uint32_t len = static_cast<uint32_t>(std::min<size_t>(
        Utf8CharLen(static_cast<unsigned char>(text[pos])), text.size() - pos));
    const int32_t index = static_cast<int32_t>(sym.size());
    sym.push_back({pos, len, index - 1, -1});
    if (index > 0) sym[index - 1].next = index;
    pos += len;
  }
  scratch->heap.clear();
  for (int32_t i = 1; i < static_cast<int32_t>(sym.size()); ++i) {
    Push(text, sym.data(), i - 1, i, scratch);
  }
  while (!scratch->heap.empty()) {
    std::pop_heap(scratch->heap.begin(), scratch->heap.end(), ScoreWorse());
    const Scratch::Candidate c = scratch->heap.back();
    scratch->heap.pop_back();
    Scratch::Symbol& left = sym[c.left];
    Scratch::Symbol& right = sym[c.right];
    if (left.size == 0 || right.size == 0 || left.next != c.right ||
        left.size + right.size != c.size) {
      continue;  // Stale: one side was merged since the push.
    }
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = c.left;
    Push(text, sym.data(), left.prev, c.left, scratch);
    Push(text, sym.data(), c.left, left.next, scratch);
  }
  for (int32_t i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
    pieces->emplace_back(sym[i].begin, sym[i].size);
  }
}

}  // namespace kvserve::models
