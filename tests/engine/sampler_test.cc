#include "engine/runner/sampler.h"

#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>

#include "engine/runner/runner_request.h"
#include "gtest/gtest.h"

namespace kvserve::engine {
namespace {

std::vector<float> Logits() { return {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f}; }

int32_t Draw(SamplingParams p, SamplerState& st,
             std::vector<int32_t> ctx = {}) {
  std::vector<float> l = Logits();
  return Sample(absl::MakeSpan(l), p, ctx, st).token;
}

TEST(SamplerTest, GreedyPicksArgmaxAndReportsLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 3;
  SamplerState st(1);
  std::vector<float> l = Logits();
  SampleResult r = Sample(absl::MakeSpan(l), p, {}, st);
  EXPECT_EQ(r.token, 1);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 1);
  EXPECT_EQ(r.top[1].token, 5);
  EXPECT_EQ(r.top[2].token, 2);
  double z = 0;
  for (float x : Logits()) z += std::exp(x - 3.0);
  EXPECT_NEAR(r.logprob, -std::log(z), 1e-5);
}

// The device-argmax path (the CUDA backend's greedy rows) must be
// indistinguishable from Sample: same token, same output counts, and the
// random stream advanced the same way (a later sampled token agrees).
TEST(SamplerTest, ArgmaxSufficesOnlyForPlainGreedy) {
  SamplingParams p;
  p.temperature = 0;
  EXPECT_TRUE(ArgmaxSuffices(p));
  // Each of these needs the whole row.
  const std::vector<void (*)(SamplingParams&)> whole_row = {
      [](SamplingParams& q) { q.logprobs = 1; },
      [](SamplingParams& q) { q.repetition_penalty = 1.1f; },
      [](SamplingParams& q) { q.presence_penalty = 0.5f; },
      [](SamplingParams& q) { q.frequency_penalty = 0.5f; },
      [](SamplingParams& q) { q.temperature = 0.7f; },
  };
  for (size_t i = 0; i < whole_row.size(); ++i) {
    SamplingParams q = p;
    whole_row[i](q);
    EXPECT_FALSE(ArgmaxSuffices(q)) << "case " << i;
  }
  SamplingParams q = p;
  q.top_k = 5;  // irrelevant when greedy
  q.top_p = 0.5f;
  EXPECT_TRUE(ArgmaxSuffices(q));

  SamplerState a(9), b(9);
  std::vector<float> l = Logits();
  const SampleResult full = Sample(absl::MakeSpan(l), p, {}, a);
  const SampleResult device = SampleFromArgmax(1, b);
  EXPECT_EQ(full.token, device.token);
  EXPECT_TRUE(device.top.empty());
  EXPECT_EQ(a.output_counts(), b.output_counts());
  SamplingParams hot;
  hot.temperature = 2.0f;
  for (int i = 0; i < 16; ++i) EXPECT_EQ(Draw(hot, a), Draw(hot, b));
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.5f;
  std::vector<int32_t> a, b, c;
  SamplerState s1(42), s2(42), s3(7);
  for (int i = 0; i < 64; ++i) {
    a.push_back(Draw(p, s1));
    b.push_back(Draw(p, s2));
    c.push_back(Draw(p, s3));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(SamplerTest, TopKTopPMinPRestrictTheCandidates) {
  SamplerState st(3);
  SamplingParams k1;
  k1.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Draw(k1, st), 1);
  SamplingParams k2;
  k2.top_k = 2;  // tokens 1 and 5 only
  for (int i = 0; i < 50; ++i) {
    const int32_t t = Draw(k2, st);
    EXPECT_TRUE(t == 1 || t == 5) << t;
  }
  SamplingParams tp;
  tp.top_p = 0.3f;  // token 1 alone holds more than 30%
  for (int i = 0; i < 20; ++i) EXPECT_EQ(Draw(tp, st), 1);
  SamplingParams mp;
  mp.min_p = 0.5f;  // p >= 0.5 * p(1): tokens 1, 5, 2
  std::map<int32_t, int> seen;
  for (int i = 0; i < 300; ++i) ++seen[Draw(mp, st)];
  for (const auto& [t, n] : seen) EXPECT_TRUE(t == 1 || t == 5 || t == 2) << t;
  EXPECT_EQ(seen.size(), 3u);
}

// The definition the sampler implements, spelled out the slow way: sort
// every token (logit descending, id ascending), take the top_k, compute
// exp((l - max) / T) in double, cut at min_p and at the top_p nucleus.
// Returns the kept tokens with their probabilities renormalized.
std::map<int32_t, double> ReferenceKept(const std::vector<float>& l,
                                        const SamplingParams& p) {
  std::vector<int32_t> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return l[a] > l[b] || (l[a] == l[b] && a < b);
  });
  if (p.top_k > 0 && p.top_k < static_cast<int32_t>(idx.size())) {
    idx.resize(p.top_k);
  }
  std::vector<double> q;
  double sum = 0;
  for (int32_t t : idx) {
    q.push_back(std::exp((double{l[t]} - l[idx[0]]) / p.temperature));
    sum += q.back();
  }
  size_t keep = idx.size();
  while (keep > 1 && q[keep - 1] < p.min_p * q[0]) --keep;
  double cum = 0;
  for (size_t i = 0; i < keep && p.top_p < 1.0f; ++i) {
    cum += q[i] / sum;
    if (cum >= p.top_p) keep = i + 1;
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += q[i];
  std::map<int32_t, double> out;
  for (size_t i = 0; i < keep; ++i) out[idx[i]] = q[i] / kept;
  return out;
}

// Draws `n` tokens and checks them against ReferenceKept: nothing outside
// the kept set, and each kept token's frequency within 5 standard
// deviations (plus 0.002) of its probability. Seeds are fixed: the test is
// deterministic; the bound is what a correct sampler meets for any seed.
void ExpectSamplesFollow(const std::vector<float>& logits,
                         const SamplingParams& p, int n,
                         const std::string& what) {
  const std::map<int32_t, double> want = ReferenceKept(logits, p);
  std::map<int32_t, int> seen;
  SamplerState st(1234);
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    ++seen[Sample(absl::MakeSpan(l), p, {}, st).token];
  }
  for (const auto& [t, c] : seen) {
    EXPECT_TRUE(want.contains(t)) << what << ": token " << t << " sampled " << c
                                  << " times is outside the kept set";
  }
  for (const auto& [t, q] : want) {
    const double f = seen.contains(t) ? static_cast<double>(seen[t]) / n : 0.0;
    EXPECT_NEAR(f, q, 5 * std::sqrt(q * (1 - q) / n) + 0.002)
        << what << ": token " << t;
  }
}

// A next-token-like distribution over a real vocabulary size: a few
// dominant tokens, a long tail (N(0, 2)), ties among the leaders, and
// masked (-inf) tokens.
std::vector<float> VocabLogits(size_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> l(vocab);
  for (float& x : l) x = normal(rng);
  const std::vector<float> lead = {14.0f, 13.5f, 13.5f, 13.0f, 12.0f,
                                   11.5f, 11.5f, 11.5f, 10.0f, 9.0f};
  for (size_t i = 0; i < lead.size(); ++i) l[(i * 7919 + 11) % vocab] = lead[i];
  for (size_t t = 3; t < vocab; t += 97) l[t] = -INFINITY;
  return l;
}

TEST(SamplerTest, TemperatureSamplingFollowsTheDefinitionOnAFullVocabulary) {
  const std::vector<float> logits = VocabLogits(49152, 5);
  struct Case {
    const char* what;
    float temperature, top_p, min_p;
    int32_t top_k;
  };
  const Case cases[] = {
      {"T=0.7", 0.7f, 1.0f, 0.0f, 0},
      {"T=0.7 top_p=0.9", 0.7f, 0.9f, 0.0f, 0},
      {"T=1 top_p=0.5", 1.0f, 0.5f, 0.0f, 0},
      {"T=0.7 top_k=3", 0.7f, 1.0f, 0.0f, 3},
      {"T=0.7 top_k=50 top_p=0.8", 0.7f, 0.8f, 0.0f, 50},
      {"T=1 min_p=0.1", 1.0f, 1.0f, 0.1f, 0},
      {"T=1 min_p=0.05 top_p=0.7", 1.0f, 0.7f, 0.05f, 0},
      {"T=1 top_k=8 min_p=0.2", 1.0f, 1.0f, 0.2f, 8},
      {"T=1 min_p=1 (the best alone)", 1.0f, 1.0f, 1.0f, 0},
      {"T=1 top_k=5 min_p=1", 1.0f, 1.0f, 1.0f, 5},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.top_k = c.top_k;
    ExpectSamplesFollow(logits, p, 4000, c.what);
  }
}

// A flat distribution: the tail carries most of the mass, so the nucleus
// spans many probability bands (and thousands of tokens); top_k beyond the
// finite tokens falls back to all of them.
TEST(SamplerTest, FlatDistributionsAndMaskedTokens) {
  std::vector<float> flat = VocabLogits(4096, 6);
  for (float& x : flat) x = std::isinf(x) ? x : x / 8;
  SamplingParams p;
  p.temperature = 3.0f;
  p.top_p = 0.95f;
  const std::map<int32_t, double> nucleus = ReferenceKept(flat, p);
  EXPECT_GT(nucleus.size(), 1000u);
  std::map<int32_t, int> seen;
  SamplerState st(8);
  for (int i = 0; i < 2000; ++i) {
    std::vector<float> l = flat;
    const int32_t t = Sample(absl::MakeSpan(l), p, {}, st).token;
    EXPECT_TRUE(nucleus.contains(t)) << t;
  }
  // Three finite tokens, top_k larger than that.
  std::vector<float> masked(1000, -INFINITY);
  masked[10] = 1.0f;
  masked[500] = 2.0f;
  masked[999] = 1.5f;
  SamplingParams q;
  q.temperature = 1.0f;
  q.top_k = 40;
  ExpectSamplesFollow(masked, q, 3000, "3 finite tokens, top_k=40");
  q.top_k = 0;
  q.top_p = 0.6f;
  ExpectSamplesFollow(masked, q, 3000, "3 finite tokens, top_p=0.6");
}

// Ties at the nucleus boundary are broken by id, as in the sort order.
TEST(SamplerTest, NucleusTiesBreakById) {
  std::vector<float> l(2000, -5.0f);
  for (int t = 100; t < 200; ++t) l[t] = 3.0f;  // 100 equal leaders
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.3f;  // about 30 of them
  const std::map<int32_t, double> want = ReferenceKept(l, p);
  ASSERT_GT(want.size(), 10u);
  ASSERT_LT(want.size(), 60u);
  EXPECT_EQ(want.begin()->first, 100);
  ExpectSamplesFollow(l, p, 6000, "100 tied leaders, top_p=0.3");
}

TEST(SamplerTest, PenaltiesSteerAwayFromRepeats) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;  // 3.0 -> 1.5 for token 1 (in context)
  SamplerState st(1);
  EXPECT_EQ(Draw(p, st, {1}), 5);
  SamplingParams q;
  q.temperature = 0;
  q.presence_penalty = 1.0f;  // applies to tokens this request produced
  SamplerState st2(1);
  EXPECT_EQ(Draw(q, st2), 1);  // produces 1, now penalized
  EXPECT_EQ(Draw(q, st2), 5);
}

// The runner's record of a request counts its output tokens when a presence
// or frequency penalty needs them: greedy on the same logits twice, the
// penalized best token loses the second time.
TEST(RunnerRequestTest, PenaltiesSeeTheTokensSampledBefore) {
  auto twice = [&](float frequency, float presence) {
    SamplingParams p;
    p.temperature = 0.0f;
    p.frequency_penalty = frequency;
    p.presence_penalty = presence;
    RunnerRequest r(p, {}, {}, false);
    std::vector<int32_t> picked;
    for (int i = 0; i < 2; ++i) {
      std::vector<float> logits = {1.0f, 0.9f, 0.1f};
      picked.push_back(
          Sample(absl::MakeSpan(logits), r.sampling, r.history, r.sampler)
              .token);
      r.Sampled(picked.back());
    }
    return picked;
  };
  EXPECT_EQ(twice(0, 0), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(twice(0.5f, 0), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(twice(0, 0.5f), (std::vector<int32_t>{0, 1}));
}

// A repetition penalty reads the prompt and every token sampled since, kept
// by the record itself: token 0 of the prompt is penalized from the first
// draw, token 1 once it has been sampled.
TEST(RunnerRequestTest, RepetitionPenaltyReadsPromptAndOutputs) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 4.0f;
  const std::vector<int32_t> prompt = {0};
  RunnerRequest r(p, {}, prompt, false);
  std::vector<int32_t> picked;
  for (int i = 0; i < 2; ++i) {
    std::vector<float> logits = {2.0f, 1.0f, 0.9f};
    picked.push_back(
        Sample(absl::MakeSpan(logits), r.sampling, r.history, r.sampler).token);
    r.Sampled(picked.back());
  }
  EXPECT_EQ(picked, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r.history, (std::vector<int32_t>{0, 1, 2}));
  // Without the penalty nothing is kept.
  EXPECT_TRUE(
      RunnerRequest(SamplingParams{}, {}, prompt, false).history.empty());
}

}  // namespace
}  // namespace kvserve::engine
