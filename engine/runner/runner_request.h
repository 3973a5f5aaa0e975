// RunnerRequest: what the model runner keeps of one request it samples for,
// from the engine's AddRequest to its RemoveRequest: the sampling parameters,
// the random stream and output counts, the context a repetition penalty
// reads, and whether its prompt step feeds n > 1 children. The runner reads
// nothing else of a request: the engine's live-request record (stream,
// detokenizer, timings) and the scheduler's are not its. A structured-output
// request also keeps its place in its grammar here (grammar/grammar_state.h):
// the runner masks each of its rows and accepts each token it emits.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/runner/sampler.h"
#include "grammar/grammar_state.h"

namespace kvserve::engine {

struct RunnerRequest {
  // `min_tokens_stops`: the tokens masked while fewer than
  // sampling.min_tokens are out (MinTokensStops). `forks`: an n > 1 parent
  // whose children sample their first token from its prompt logits.
  RunnerRequest(const SamplingParams& p, std::vector<int32_t> min_tokens_stops,
                absl::Span<const int32_t> prompt, bool forks,
                std::unique_ptr<grammar::GrammarState> grammar_state = nullptr)
      : sampling(p),
        sampler(p.seed,
                p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f),
        forks_pending(forks),
        grammar(std::move(grammar_state)) {
    sampler.SetMinTokensStops(std::move(min_tokens_stops));
    if (p.repetition_penalty != 1.0f)
      history.assign(prompt.begin(), prompt.end());
  }

  // Whether the next token can come from the device argmax alone (then the
  // backend need not copy its logits row to the host): a fork parent's
  // first token needs the whole row, otherwise the parameters decide.
  [[nodiscard]] bool NeedsOnlyArgmax() const {
    return !forks_pending && grammar == nullptr && ArgmaxSuffices(sampling);
  }
  // Records a token sampled for it (the sampler has counted it).
  void Sampled(int32_t token) {
    if (sampling.repetition_penalty != 1.0f) history.push_back(token);
  }

  SamplingParams sampling;
  SamplerState sampler;
  // Prompt + outputs so far, kept only for a repetition penalty (the
  // context it reads), appended as tokens are sampled.
  std::vector<int32_t> history;
  // Until its first token: an n > 1 parent's prompt step hands its raw
  // logits row to the children.
  bool forks_pending;
  // Structured output: the grammar's state after the tokens emitted so far
  // (null: unconstrained).
  std::unique_ptr<grammar::GrammarState> grammar;
};

}  // namespace kvserve::engine
