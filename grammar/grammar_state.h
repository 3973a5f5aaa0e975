// GrammarState: one sequence's place in its grammar (XGrammar's matcher),
// beside its KV: it masks the sequence's next logits row to the tokens the
// grammar allows and advances by the token sampled from it.
//
// Invariants: the state has accepted exactly the sequence's output tokens
// so far (the runner accepts each token it emits, and nothing else), so a
// preempted sequence recomputed from its tokens keeps its state as is, and
// a draft token that verification rejects never reaches it. Once the
// grammar is complete only the end-of-generation tokens (or the request's
// stop ids) are allowed; accepting one terminates the state.
//
// Not thread-safe: the engine thread owns it (through RunnerRequest).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "grammar/grammar_compiler.h"

namespace kvserve::grammar {

class GrammarState {
 public:
  // `stop_ids`: the tokens that end the output once the grammar is complete
  // (empty: the model's end-of-generation tokens).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GrammarState>> Create(
      std::shared_ptr<const CompiledGrammar> grammar,
      std::vector<int32_t> stop_ids);
  ~GrammarState();
  GrammarState(const GrammarState&) = delete;
  GrammarState& operator=(const GrammarState&) = delete;

  // Computes the mask of the tokens the grammar allows next (XGrammar's
  // bitmask, the costly part) into the state, for MaskLogits. It reads
  // only the state, so it may run on another thread while the owner
  // leaves the state alone (the runner overlaps it with the forward).
  void FillMask();
  // FillMask's mask is current (no token accepted since).
  [[nodiscard]] bool mask_ready() const;
  // Sets the logits of the tokens the grammar does not allow next to -inf
  // (`logits` is one row of the model's vocab_size), with the mask
  // FillMask computed since the last Accept or Rollback, else computing
  // it. Returns how many tokens stay allowed (0 only on a terminated
  // state).
  int32_t MaskLogits(absl::Span<float> logits);
  // Advances past `token`; false when the grammar does not allow it (the
  // state is unchanged).
  [[nodiscard]] bool Accept(int32_t token);
  // Undoes the last `tokens` accepted tokens.
  void Rollback(int32_t tokens);
  // A copy at the same place (a fork's child goes on from here).
  [[nodiscard]] std::unique_ptr<GrammarState> Fork() const;
  [[nodiscard]] bool terminated() const;
  // The grammar's match is complete (only stop tokens may follow).
  [[nodiscard]] bool completed() const;

 private:
  struct Impl;
  explicit GrammarState(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve::grammar
