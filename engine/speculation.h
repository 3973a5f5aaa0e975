// Speculative decoding on the engine side: the prompt-lookup (n-gram)
// proposer (the draft-model one is engine/runner/draft_model.h) and the
// per-request controller that decides how many draft
// tokens a decode step verifies. The scheduler schedules a draft with the
// request's last token (Scheduler::SetDraft); the model runner samples each
// row as decoding without a draft would and keeps the drafts it sampled
// (ModelRunner::SampleAll), so outputs do not change, only how many come
// out of one forward.
//
// "Never slower": a draft costs its tokens' share of the forward, so it is
// proposed only where it is likely to pay: not when more than
// max_decode_batch sequences decode (verification competes with other
// sequences' tokens for the step's compute), and not for a request whose
// recent drafts were mostly rejected (it backs off exponentially).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvcache/kv_cache_manager.h"

namespace kvserve::engine {

enum class SpeculativeMode { kOff, kNgram, kDraft };

// "off", "ngram" or "draft"; InvalidArgument naming --speculative otherwise.
[[nodiscard]] absl::StatusOr<SpeculativeMode> ParseSpeculativeMode(
    absl::string_view name);
[[nodiscard]] const char* SpeculativeModeName(SpeculativeMode mode);

struct SpeculativeConfig {
  SpeculativeMode mode = SpeculativeMode::kOff;
  int32_t num_tokens = 8;  // --num-speculative-tokens: most drafts per step
  // Prompt lookup: the longest suffix of ngram_max down to ngram_min tokens
  // that occurred before.
  int32_t ngram_max = 8, ngram_min = 1;
  // Decoding sequences above which no draft is proposed.
  int32_t max_decode_batch = 4;
  // kDraft: the draft model's file (engine/runner/draft_model.h) and the
  // probability below which it stops drafting a sequence.
  std::string draft_model;
  float draft_p_min = 0.0f;
};

// Prompt lookup: the (at most k) tokens that followed the latest earlier
// occurrence of the longest suffix of `tokens` of ngram_max down to
// ngram_min tokens; empty when none occurred. O(tokens x ngram_max).
[[nodiscard]] std::vector<int32_t> NgramDraft(
    const kvcache::TokenSequence& tokens, int32_t ngram_max, int32_t ngram_min,
    int32_t k);

// What a draft token costs, in plain decode steps (the engine's measure,
// shared by its requests): verifying it (the forward's extra time per draft
// token over a decode step without drafts) plus proposing it (the draft
// model's seconds per draft token over a plain step's; prompt lookup costs
// nothing). Moving averages of pure decode steps (no prompt tokens).
class SpeculationCost {
 public:
  // A decode step's forward: `seconds` for `seqs` sequences and `drafts`
  // draft tokens verified among them.
  void ObserveStep(double seconds, int64_t seqs, int64_t drafts);
  // The draft model's forwards of one step: `seconds` for `drafts` tokens.
  void ObserveDraft(double seconds, int64_t drafts);
  [[nodiscard]] double PerDraftToken() const { return verify_ + propose_; }

 private:
  double plain_ = 0;       // seconds of a decode step per sequence, no drafts
  double verify_ = 0.1;    // extra per verified draft token, in plain steps
  double draft_secs_ = 0;  // draft model seconds per draft token
  double propose_ = 0;     // draft_secs_ / plain_
};

// One request's acceptance history. Draft() says how many tokens to
// propose next (0: skip this step); Observe() records a verified draft.
class SpeculationControl {
 public:
  // The k <= max_tokens that maximizes the tokens a step yields per unit of
  // cost, (1 + a + a^2 + ... + a^k) / (1 + k * cost_per_token) for this
  // request's acceptance rate a; at least 1 (so the rate stays measured;
  // a poor rate backs off in Observe).
  [[nodiscard]] int32_t Draft(int32_t max_tokens, double cost_per_token);
  void Observe(int32_t drafted, int32_t accepted);
  // The proposer found nothing: sit the next step out (text without
  // repeats then pays a scan of its context every other step; a longer
  // pause after repeated misses lost more accepted drafts in grounded
  // text than it saved: tools/spec_bench.py, 1.94x -> 2.16x).
  void NoDraft();

 private:
  double accept_rate_ = 0.5;  // moving average of accepted / drafted
  int32_t backoff_ = 0;       // steps to sit out after a poor run
  int32_t skip_ = 0;          // steps left to sit out
};

}  // namespace kvserve::engine
