// BPE merge engines over one pre-tokenized word. Owns the merge tables; does
// not own the vocab strings, pre-tokenization or special-token handling
// (tokenizer.h does). Both engines are const after construction and
// thread-safe; the per-call scratch is the caller's.
//
//   BpeRankMerger   rank-driven (GPT-2 / HF `tokenizers` BPE): repeatedly
//                   applies the lowest-rank merge present, leftmost first.
//   SpmScoreMerger  score-driven (llama.cpp llm_tokenizer_spm): repeatedly
//                   merges the adjacent pair whose concatenation is a vocab
//                   token with the highest score, leftmost first.
//
// Both keep the word as a doubly linked list of symbols and a binary heap of
// candidate pairs; stale heap entries are detected on pop, so a word of n
// symbols costs O(n log n).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace kvserve::models {

class BpeRankMerger {
 public:
  // Registers merge `rank`: left + right -> result. A pair registered twice
  // keeps its first (lowest) rank.
  void Add(int32_t left, int32_t right, int32_t result, int32_t rank);
  size_t size() const { return merges_.size(); }

  // Scratch reused across words of one Encode call.
  struct Scratch {
    struct Symbol {
      int32_t id;
      int32_t prev;
      int32_t next;
    };
    struct Candidate {
      int32_t rank;
      int32_t left;  // symbol indices
      int32_t right;
      int32_t left_id;
      int32_t right_id;
      int32_t result;
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Merges the symbols `ids` (initial token ids, in order) and appends the
  // resulting ids to `out`.
  void Merge(const std::vector<int32_t>& ids, Scratch* scratch,
             std::vector<int32_t>* out) const;

 private:
  struct MergeInfo {
    int32_t rank;
    int32_t result;
  };
  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  void Push(const Scratch::Symbol* symbols, int32_t left, int32_t right,
            Scratch* scratch) const;

  absl::flat_hash_map<uint64_t, MergeInfo> merges_;
};

class SpmScoreMerger {
 public:
  // `vocab` maps token text to id and `scores` id to score; both must
  // outlive the merger.
  SpmScoreMerger(const absl::flat_hash_map<std::string, int32_t>* vocab,
                 const std::vector<float>* scores)
      : vocab_(vocab), scores_(scores) {}

  struct Scratch {
    struct Symbol {
      uint32_t begin;  // byte offset into the text
      uint32_t size;   // 0 once merged away
      int32_t prev;
      int32_t next;
    };
    struct Candidate {
      float score;
      int32_t left;
      int32_t right;
      uint32_t size;  // bytes of left + right when pushed
    };
    std::vector<Symbol> symbols;
    std::vector<Candidate> heap;
  };

  // Splits `text` (UTF-8) into characters, merges them, and appends the
  // final pieces as (begin, size) byte ranges of `text` to `pieces`.
  void Merge(std::string_view text, Scratch* scratch,
             std::vector<std::pair<uint32_t, uint32_t>>* pieces) const;

 private:
  void Push(std::string_view text, const Scratch::Symbol* symbols, int32_t left,
            int32_t right, Scratch* scratch) const;

  const absl::flat_hash_map<std::string, int32_t>* vocab_;
  const std::vector<float>* scores_;
};

}  // namespace kvserve::models
