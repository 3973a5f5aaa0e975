// Token sampling on the CPU from one sequence's logits: penalties,
// temperature, top-k, top-p, min-p, seeded randomness, and top-n logprobs.
// Deterministic for a given seed whatever else is in the batch: each request
// owns its own random stream (SamplerState) and draws exactly one number per
// sampled token.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace kvserve::engine {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // over prompt + output, HF semantics
  float presence_penalty = 0.0f;    // over output, OpenAI semantics
  float frequency_penalty = 0.0f;   // over output, OpenAI semantics
  uint64_t seed = 0;
  int32_t logprobs = 0;  // top-n logprobs to report (0 = none)
  // Until this many tokens are out, the state's stop ids
  // (SamplerState::SetMinTokensStops) cannot be sampled (vLLM's min_tokens).
  int32_t min_tokens = 0;
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;  // of the chosen token (raw model dist); only when
                         // SamplingParams::logprobs > 0
  std::vector<TokenLogprob> top;  // top-n by raw logprob, if requested
};

// Per-request sampling state: the random stream and output token counts.
class SamplerState {
 public:
  // count_outputs: keep per-token counts for the presence and frequency
  // penalties (a hash-map update per token, skipped when none applies).
  explicit SamplerState(uint64_t seed, bool count_outputs = true)
      : rng_(seed), count_outputs_(count_outputs) {}
  // Records a token the request produced.
  void AddOutputToken(int32_t token) {
    if (count_outputs_) ++output_counts_[token];
    ++num_output_tokens_;
  }
  int32_t num_output_tokens() const { return num_output_tokens_; }
  // The tokens that would stop the request (EOS, stop token ids): masked
  // while fewer than SamplingParams::min_tokens are out.
  void SetMinTokensStops(std::vector<int32_t> ids) {
    min_tokens_stops_ = std::move(ids);
  }
  const std::vector<int32_t>& min_tokens_stops() const {
    return min_tokens_stops_;
  }
  // A double in [0, 1) with 53 random bits: SplitMix64 (8 bytes of state;
  // a request holds one, so thousands of live requests stay in cache, where
  // a Mersenne Twister's 2.5 KB each did not).
  double NextUniform() {
    uint64_t z = (rng_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }
  const absl::flat_hash_map<int32_t, int32_t>& output_counts() const {
    return output_counts_;
  }

 private:
  uint64_t rng_;
  bool count_outputs_;
  absl::flat_hash_map<int32_t, int32_t> output_counts_;
  int32_t num_output_tokens_ = 0;
  std::vector<int32_t> min_tokens_stops_;
};

// True when Sample with `params` returns the row's raw argmax and nothing
// else (greedy, no penalties, no logprobs): the token may then come from an
// argmax computed where the logits are (the GPU) instead of the full row.
bool ArgmaxSuffices(const SamplingParams& params);

// What Sample returns, and the state change it makes, for params where
// ArgmaxSuffices holds and a row whose argmax is `token`.
SampleResult SampleFromArgmax(int32_t token, SamplerState& state);

// Samples one token. `logits` is modified in place (penalties, temperature).
// `context_tokens` holds prompt + output tokens for the repetition penalty.
SampleResult Sample(absl::Span<float> logits, const SamplingParams& params,
                    absl::Span<const int32_t> context_tokens,
                    SamplerState& state);

}  // namespace kvserve::engine
