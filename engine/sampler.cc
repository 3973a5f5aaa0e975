#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_set.h"

namespace kvserve::engine {
namespace {

void ApplyPenalties(absl::Span<float> logits, const SamplingParams& p,
                    absl::Span<const int32_t> context,
                    const SamplerState& state) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (p.repetition_penalty != 1.0f) {
    absl::flat_hash_set<int32_t> seen(context.begin(), context.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= vocab) continue;
      float& l = logits[t];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [t, count] : state.output_counts()) {
      if (t < 0 || t >= vocab) continue;
      logits[t] -= p.presence_penalty + p.frequency_penalty * count;
    }
  }
}

// log-softmax normalizer of `logits`.
double LogSumExp(absl::Span<const float> logits) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l - mx));
  return mx + std::log(sum);
}

void FillLogprobs(absl::Span<const float> raw, int32_t chosen, int32_t n,
                  SampleResult& out) {
  const double lse = LogSumExp(raw);
  out.logprob = static_cast<float>(raw[chosen] - lse);
  if (n <= 0) return;
  n = std::min<int32_t>(n, raw.size());
  std::vector<int32_t> idx(raw.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](int32_t a, int32_t b) {
                      return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
                    });
  for (int32_t i = 0; i < n; ++i) {
    out.top.push_back({idx[i], static_cast<float>(raw[idx[i]] - lse)});
  }
}

int32_t Argmax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                              logits.begin());
}

}  // namespace

bool ArgmaxSuffices(const SamplingParams& p) {
  return p.temperature <= 0.0f && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         p.logprobs <= 0;
}

SampleResult SampleFromArgmax(int32_t token, SamplerState& state) {
  SampleResult result;
  result.token = token;
  state.NextUniform();  // the draw Sample makes in greedy mode
  state.AddOutputToken(token);
  return result;
}

SampleResult Sample(absl::Span<float> logits, const SamplingParams& p,
                    absl::Span<const int32_t> context, SamplerState& state) {
  SampleResult result;
  // Logprobs report the model's raw distribution, before penalties; only
  // penalties modify `logits`, so copy only when they apply.
  const bool penalized = p.repetition_penalty != 1.0f ||
                         p.presence_penalty != 0.0f ||
                         p.frequency_penalty != 0.0f;
  std::vector<float> raw_copy;
  if (penalized) raw_copy.assign(logits.begin(), logits.end());
  absl::Span<const float> raw =
      penalized ? absl::Span<const float>(raw_copy) : logits;
  ApplyPenalties(logits, p, context, state);

  int32_t chosen;
  if (p.temperature <= 0.0f) {
    chosen = Argmax(logits);
    state.NextUniform();  // keep one draw per token regardless of mode
  } else {
    // Candidates sorted by logit (descending), ties by id for determinism.
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    const size_t k = (p.top_k > 0 && p.top_k < static_cast<int32_t>(idx.size()))
                         ? static_cast<size_t>(p.top_k)
                         : idx.size();
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
    idx.resize(k);
    const double mx = logits[idx[0]];
    std::vector<double> probs(k);
    double sum = 0.0;
    for (size_t i = 0; i < k; ++i) {
      probs[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
      sum += probs[i];
    }
    size_t keep = k;
    if (p.min_p > 0.0f) {  // relative to the most likely token (probs[0])
      const double floor = p.min_p * probs[0];
      while (keep > 1 && probs[keep - 1] < floor) --keep;
    }
    if (p.top_p < 1.0f) {
      double cum = 0.0;
      for (size_t i = 0; i < keep; ++i) {
        cum += probs[i] / sum;
        if (cum >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    double kept = 0.0;
    for (size_t i = 0; i < keep; ++i) kept += probs[i];
    const double u = state.NextUniform() * kept;
    double acc = 0.0;
    chosen = idx[keep - 1];
    for (size_t i = 0; i < keep; ++i) {
      acc += probs[i];
      if (u < acc) {
        chosen = idx[i];
        break;
      }
    }
  }
  result.token = chosen;
  // The log-softmax over the whole vocabulary costs ~7% of a saturated
  // decode step (perf, docs/PERFORMANCE.md): only pay it when asked.
  if (p.logprobs > 0) FillLogprobs(raw, chosen, p.logprobs, result);
  state.AddOutputToken(chosen);
  return result;
}

}  // namespace kvserve::engine
