#include "engine/sampler.h"

#include <map>

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
  SamplingParams q = p;
  q.logprobs = 1;
  EXPECT_FALSE(ArgmaxSuffices(q));
  q = p;
  q.repetition_penalty = 1.1f;
  EXPECT_FALSE(ArgmaxSuffices(q));
  q = p;
  q.presence_penalty = 0.5f;
  EXPECT_FALSE(ArgmaxSuffices(q));
  q = p;
  q.frequency_penalty = 0.5f;
  EXPECT_FALSE(ArgmaxSuffices(q));
  q = p;
  q.temperature = 0.7f;
  EXPECT_FALSE(ArgmaxSuffices(q));
  q = p;
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

}  // namespace
}  // namespace kvserve::engine
