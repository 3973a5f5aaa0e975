// Host sampling cost per token (engine::Sample) for the engine thread, which
// samples every sequence of a step one after another: at batch 64 a
// millisecond per token is 64 ms per step.
//
//   BM_Sample/<vocab>/<mode>
//     mode 0 greedy, 1 temperature 0.8 (no truncation: the OpenAI default
//     shape), 2 temperature 0.8 + top_p 0.9, 3 temperature 0.8 + top_k 50,
//     4 greedy + 5 logprobs, 5 temperature 0.8 + min_p 0.05
//
//   BM_SampleSortAll/<vocab>/<mode>
//     the baseline, in the same run: the sampler before it stopped sorting
//     the vocabulary (sort every candidate, std::exp in double,
//     std::max_element for greedy); its ratio to BM_Sample is the speedup.
//
// Logits: N(0, 3^2) with ten tokens lifted by 8 to 12 (a peaked next-token
// distribution: most of the mass on a few tokens, a long flat tail).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/runner/sampler.h"

namespace kvserve::engine {
namespace {

std::vector<float> PeakedLogits(int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> l(vocab);
  for (float& x : l) x = normal(rng);
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  for (int i = 0; i < 10; ++i) l[pick(rng)] += 8.0f + 0.4f * i;
  return l;
}

SamplingParams Mode(int mode) {
  SamplingParams p;
  p.temperature = 0.8f;
  switch (mode) {
    case 0:
      p.temperature = 0.0f;
      break;
    case 2:
      p.top_p = 0.9f;
      break;
    case 3:
      p.top_k = 50;
      break;
    case 4:
      p.temperature = 0.0f;
      p.logprobs = 5;
      break;
    case 5:
      p.min_p = 0.05f;
      break;
    default:
      break;
  }
  return p;
}

// The previous sampler (no penalties, no logprobs): every candidate
// sorted by logit, probabilities in double, a walk along the sorted order.
int32_t SortAllSample(const std::vector<float>& logits, const SamplingParams& p,
                      SamplerState& state) {
  if (p.temperature <= 0.0f) {
    state.NextUniform();
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                logits.begin());
  }
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  const size_t k = p.top_k > 0 && static_cast<size_t>(p.top_k) < idx.size()
                       ? static_cast<size_t>(p.top_k)
                       : idx.size();
  std::partial_sort(
      idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
      });
  idx.resize(k);
  const double mx = logits[idx[0]];
  std::vector<double> probs(k);
  double sum = 0.0;
  for (size_t i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[idx[i]] - mx) / p.temperature);
    sum += probs[i];
  }
  size_t keep = k;
  while (p.min_p > 0.0f && keep > 1 && probs[keep - 1] < p.min_p * probs[0]) {
    --keep;
  }
  double cum = 0.0;
  for (size_t i = 0; p.top_p < 1.0f && i < keep; ++i) {
    cum += probs[i] / sum;
    if (cum >= p.top_p) keep = i + 1;
  }
  double kept = 0.0;
  for (size_t i = 0; i < keep; ++i) kept += probs[i];
  const double u = state.NextUniform() * kept;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return idx[i];
  }
  return idx[keep - 1];
}

void BM_SampleSortAll(benchmark::State& state) {
  const std::vector<float> logits = PeakedLogits(state.range(0), 7);
  const SamplingParams p = Mode(static_cast<int>(state.range(1)));
  if (p.logprobs > 0) {
    state.SkipWithError("logprobs: not part of the baseline");
    return;
  }
  SamplerState s(11);
  for (auto _ : state) {
    benchmark::DoNotOptimize(SortAllSample(logits, p, s));
  }
}
BENCHMARK(BM_SampleSortAll)
    ->ArgsProduct({{49152, 128256}, {0, 1, 2, 3, 5}})
    ->Unit(benchmark::kMicrosecond);

void BM_Sample(benchmark::State& state) {
  std::vector<float> logits = PeakedLogits(state.range(0), 7);
  const SamplingParams p = Mode(static_cast<int>(state.range(1)));
  SamplerState s(11);
  for (auto _ : state) {
    benchmark::DoNotOptimize(Sample(absl::MakeSpan(logits), p, {}, s));
  }
}
BENCHMARK(BM_Sample)
    ->ArgsProduct({{49152, 128256}, {0, 1, 2, 3, 4, 5}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvserve::engine

BENCHMARK_MAIN();
