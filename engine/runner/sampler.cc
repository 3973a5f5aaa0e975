#include "engine/runner/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_set.h"
// Static dispatch only: the build targets its own CPU (-march=native), and
// Highway 1.0's dynamic target list can miss that baseline (AVX3_DL).
#define HWY_COMPILE_ONLY_STATIC 1
#include "hwy/highway.h"
// The math header after highway.h, which it builds on.
#include "hwy/contrib/math/math-inl.h"

namespace kvserve::engine {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

// prob[t] = exp((logits[t] - mx) * inv_temp) for t < n: Highway's vector
// exp (1 ULP; 0 below -104), for the target this file is compiled for.
void ShiftedExp(const float* logits, size_t n, float mx, float inv_temp,
                float* prob) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  const auto vmx = hn::Set(d, mx);
  const auto vinv = hn::Set(d, inv_temp);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto x = hn::Mul(hn::Sub(hn::LoadU(d, logits + i), vmx), vinv);
    hn::StoreU(hn::Exp(d, x), d, prob + i);
  }
  if (i == n) return;
  HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
  std::fill_n(tail, lanes, mx);
  std::copy(logits + i, logits + n, tail);
  const auto x = hn::Mul(hn::Sub(hn::Load(d, tail), vmx), vinv);
  hn::Store(hn::Exp(d, x), d, tail);
  std::copy_n(tail, n - i, prob + i);
}

// Sum in double (four independent chains).
double SumAsDouble(const float* v, size_t n) {
  double a[4] = {0.0, 0.0, 0.0, 0.0};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (size_t j = 0; j < 4; ++j) a[j] += v[i + j];
  }
  for (; i < n; ++i) a[0] += v[i];
  return (a[0] + a[1]) + (a[2] + a[3]);
}

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

// The largest value (-inf for none; rows are expected NaN-free).
float MaxValue(absl::Span<const float> v) {
  const hn::ScalableTag<float> d;
  const size_t lanes = hn::Lanes(d);
  auto m = hn::Set(d, -std::numeric_limits<float>::infinity());
  size_t i = 0;
  for (; i + lanes <= v.size(); i += lanes) {
    m = hn::Max(m, hn::LoadU(d, v.data() + i));
  }
  float mx = hn::GetLane(hn::MaxOfLanes(d, m));
  for (; i < v.size(); ++i) mx = std::max(mx, v[i]);
  return mx;
}

// log-softmax normalizer of `logits` (the vector exp: 1 ULP per term).
double LogSumExp(absl::Span<const float> logits) {
  thread_local std::vector<float> e;
  e.resize(logits.size());
  const float mx = MaxValue(logits);
  ShiftedExp(logits.data(), logits.size(), mx, 1.0f, e.data());
  return mx + std::log(SumAsDouble(e.data(), e.size()));
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

// The first index of the largest value (std::max_element's answer), in two
// passes that vectorize: ~5x faster than max_element's compare chain.
int32_t Argmax(absl::Span<const float> logits) {
  const float mx = MaxValue(logits);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == mx) return static_cast<int32_t>(i);
  }
  // Nothing equals it: NaNs only; max_element's answer.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                              logits.begin());
}

// Sampling order: logit descending, id ascending on ties.
struct ByLogit {
  absl::Span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// Ids t with lo <= v[t] < hi (ascending), appended to `out`.
void CollectBand(absl::Span<const float> v, float lo, float hi,
                 std::vector<int32_t>* out) {
  for (size_t t = 0; t < v.size(); ++t) {
    if (v[t] >= lo && v[t] < hi) out->push_back(static_cast<int32_t>(t));
  }
}

// The top_k best candidates in sampling order: tokens within a logit
// window of the best (counted in one pass, the window doubling until it
// holds k), then a selection among those few.
void TopK(absl::Span<const float> logits, float mx, size_t k,
          std::vector<int32_t>* out) {
  float window = 8.0f;
  while (true) {
    size_t n = 0;
    for (float l : logits) n += l >= mx - window ? 1 : 0;
    if (n >= k || !(mx - window > -std::numeric_limits<float>::max())) break;
    window *= 4.0f;
  }
  out->clear();
  CollectBand(logits, mx - window, std::numeric_limits<float>::infinity(), out);
  if (out->size() < k) {  // -inf or NaN logits left out: take everything
    out->resize(logits.size());
    std::iota(out->begin(), out->end(), 0);
  }
  const ByLogit by{logits};
  std::partial_sort(out->begin(), out->begin() + k, out->end(), by);
  out->resize(k);
}

// The nucleus of top_p (the shortest prefix of the sampling order whose
// probability reaches top_p of `sum`), restricted to prob >= floor:
// gathered in bands of decreasing probability (each band 2^-8 of the
// previous bound, appended and ordered as far as the walk needs), so a
// peaked distribution costs one pass and a short sort. Returns the nucleus in
// sampling order in `out` and its total probability.
double Nucleus(absl::Span<const float> logits, absl::Span<const float> prob,
               double sum, float top_p, float floor,
               std::vector<int32_t>* out) {
  out->clear();
  const ByLogit by{logits};
  double cum = 0.0;
  float hi = std::numeric_limits<float>::infinity(), lo = 1.0f / 256;
  size_t walked = 0;
  while (true) {
    lo = std::max(lo, floor);
    CollectBand(prob, lo, hi, out);
    // The band is put in order only as far as the walk goes: the next
    // max(64, done so far) of it at a time.
    size_t ordered = walked;
    for (; walked < out->size(); ++walked) {
      if (walked == ordered) {
        ordered = std::min(out->size(), walked + std::max<size_t>(64, walked));
        const auto at = [&](size_t i) {
          return out->begin() + static_cast<ptrdiff_t>(i);
        };
        std::partial_sort(at(walked), at(ordered), out->end(), by);
      }
      cum += prob[(*out)[walked]];
      if (cum >= top_p * sum) {
        out->resize(walked + 1);
        return cum;
      }
    }
    if (lo <= floor || lo == 0.0f) return cum;  // everything allowed is in
    hi = lo;
    lo = lo < 1e-30f ? 0.0f : lo / 256;
  }
}

// Temperature sampling with top-k, min-p and top-p (see sampler.h):
// probabilities exp((l - max) / T) over the top_k best or the whole
// vocabulary (Highway's vector exp); min_p keeps those at least min_p times
// the best's; top_p keeps the nucleus; one uniform draw picks along the
// kept set (in sampling order when it was truncated by top_k or top_p,
// else in id order: every fixed order samples the same distribution, and
// id order needs no sort).
int32_t SampleWithTemperature(absl::Span<const float> logits,
                              const SamplingParams& p, SamplerState& state) {
  // Scratch reused across calls on the engine thread: no page faults for
  // vocabulary-sized buffers every token.
  thread_local std::vector<int32_t> ids;
  thread_local std::vector<float> prob;  // by token id
  const size_t vocab = logits.size();
  const float mx = MaxValue(logits);
  const float inv_temp = 1.0f / p.temperature;
  float floor = 0.0f;  // min_p times the best's probability (exp(0): 1)
  prob.resize(vocab);
  double kept = 0.0;
  bool ordered = true;  // ids holds the kept set in sampling order
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < vocab) {
    TopK(logits, mx, static_cast<size_t>(p.top_k), &ids);
    double sum = 0.0;
    for (int32_t t : ids)
      sum += prob[t] = std::exp((logits[t] - mx) * inv_temp);
    floor = p.min_p * prob[ids[0]];
    size_t keep = 0;
    while (keep < ids.size() && prob[ids[keep]] >= floor) ++keep;
    keep = std::max<size_t>(keep, 1);
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += prob[ids[i]];
      if (p.top_p < 1.0f && cum >= p.top_p * sum) keep = i + 1;
    }
    ids.resize(keep);
    kept = cum;
  } else {
    ShiftedExp(logits.data(), vocab, mx, inv_temp, prob.data());
    const double sum = SumAsDouble(prob.data(), vocab);
    if (p.min_p > 0.0f) floor = p.min_p * MaxValue(prob);
    if (p.top_p < 1.0f) {
      kept = Nucleus(logits, prob, sum, p.top_p, floor, &ids);
    } else {
      ordered = false;
      kept = sum;
      if (floor > 0.0f) {
        kept = 0.0;
        for (float q : prob) kept += q >= floor ? q : 0.0f;
      }
    }
  }
  const double u = state.NextUniform() * kept;
  double acc = 0.0;
  if (ordered) {
    for (int32_t t : ids) {
      acc += prob[t];
      if (u < acc) return t;
    }
    return ids.back();  // rounding: u at the very top of the range
  }
  int32_t last = 0;
  for (size_t t = 0; t < vocab; ++t) {
    if (prob[t] < floor || prob[t] == 0.0f) continue;
    acc += prob[t];
    last = static_cast<int32_t>(t);
    if (u < acc) return last;
  }
  return last;
}

}  // namespace

bool ArgmaxSuffices(const SamplingParams& p) {
  return p.temperature <= 0.0f && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         p.logprobs <= 0 && p.min_tokens <= 0;
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
  const bool suppress = state.num_output_tokens() < p.min_tokens;
  const bool penalized = p.repetition_penalty != 1.0f ||
                         p.presence_penalty != 0.0f ||
                         p.frequency_penalty != 0.0f || suppress;
  std::vector<float> raw_copy;
  if (penalized) raw_copy.assign(logits.begin(), logits.end());
  absl::Span<const float> raw =
      penalized ? absl::Span<const float>(raw_copy) : logits;
  ApplyPenalties(logits, p, context, state);
  if (suppress) {
    for (int32_t id : state.min_tokens_stops()) {
      if (id >= 0 && static_cast<size_t>(id) < logits.size()) {
        logits[id] = -std::numeric_limits<float>::infinity();
      }
    }
  }

  int32_t chosen;
  if (p.temperature <= 0.0f) {
    chosen = Argmax(logits);
    state.NextUniform();  // keep one draw per token regardless of mode
  } else {
    chosen = SampleWithTemperature(logits, p, state);
  }
  result.token = chosen;
  // The log-softmax over the whole vocabulary costs ~7% of a saturated
  // decode step (perf, docs/PERFORMANCE.md): only pay it when asked.
  if (p.logprobs > 0) FillLogprobs(raw, chosen, p.logprobs, result);
  state.AddOutputToken(chosen);
  return result;
}

}  // namespace kvserve::engine
