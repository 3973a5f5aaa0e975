// Sampled speculative decoding leaves the target's distribution unchanged.
// A draft token x proposed with probability 1 (a greedy draft model or a
// prompt-lookup copy) is accepted by the standard rejection rule with
// probability min(1, p(x) / 1) = p(x), and a rejection samples from
// max(0, p - q), i.e. p without x, renormalised. ModelRunner samples the
// row as decoding without a draft would and accepts x when it drew x: the
// same law. This test checks it by counting, on the FakeBackend's
// three-peaked rows (logits 6, 5, 4 on the predicted token and the two
// after it, 0 elsewhere), over 4,000 seeded requests per draft: the
// emitted token, the acceptance rate, and the bonus token after an
// accepted draft. ~1 s.
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "engine/runner/model_runner.h"
#include "gtest/gtest.h"
#include "scheduler/scheduler.h"
#include "tests/engine/fake_backend.h"

namespace kvserve::engine {
namespace {

constexpr int32_t kVocab = 64;
constexpr int32_t kBlockSize = 4;

// Token offsets from the predicted token: 0, 1, 2, and any other.
constexpr int kClasses = 4;

std::vector<double> TargetLaw() {
  const double z = std::exp(6.0) + std::exp(5.0) + std::exp(4.0) + (kVocab - 3);
  return {std::exp(6.0) / z, std::exp(5.0) / z, std::exp(4.0) / z,
          (kVocab - 3) / z};
}

int ClassOf(int32_t token, int32_t predicted) {
  const int32_t off = ((token - predicted) % kVocab + kVocab) % kVocab;
  return off < 3 ? off : 3;
}

// Pearson's statistic of `counts` against `law`.
double ChiSquare(const std::vector<int>& counts,
                 const std::vector<double>& law) {
  int total = 0;
  for (int c : counts) total += c;
  double chi = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = law[i] * total;
    chi += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi;
}

struct Tally {
  std::vector<int> first = std::vector<int>(kClasses, 0);  // emitted token
  std::vector<int> bonus = std::vector<int>(kClasses, 0);  // after accepted
  int accepted = 0;
};

// One seeded request with prompt {2, 3}: its prefill samples t1, then a
// decode step verifies the one-token draft predicted(t1) + `offset`.
void RunOne(uint64_t seed, int32_t offset, Tally* tally) {
  scheduler::SchedulerConfig c;
  c.max_num_seqs = 1;
  c.max_num_batched_tokens = 16;
  c.block_size = kBlockSize;
  c.num_blocks = 8;
  c.watermark = 0.0;
  c.max_model_len = 16;
  scheduler::Scheduler sched(c);
  test::FakeBackend::Options o;
  o.num_blocks = 8;
  o.block_size = kBlockSize;
  o.vocab = kVocab;
  ModelRunner runner(std::make_unique<test::FakeBackend>(o), kBlockSize, kVocab,
                     absl::ZeroDuration());
  const std::vector<int32_t> prompt = {2, 3};
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.seed = seed;
  ASSERT_TRUE(runner.AddRequest(1, sp, {}, prompt, false).ok());
  ASSERT_TRUE(
      sched.AddRequest(std::make_unique<scheduler::Request>(1, prompt, 8))
          .ok());
  scheduler::SchedulerOutput out = sched.Schedule();
  StepResult res = runner.Execute(out);
  ASSERT_TRUE(res.status.ok()) << res.status;
  (void)sched.UpdateFromOutput(out, res.tokens, res.counts);
  const int32_t predicted =
      test::FakeBackend::NextToken(prompt[0], res.tokens[0], kVocab);
  const int32_t draft = (predicted + offset) % kVocab;
  sched.SetDraft(1, {draft});
  out = sched.Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  ASSERT_EQ(out.scheduled[0].num_draft_tokens, 1);
  res = runner.Execute(out);
  ASSERT_TRUE(res.status.ok()) << res.status;
  ASSERT_EQ(res.counts.size(), 1u);
  ++tally->first[ClassOf(res.tokens[0], predicted)];
  if (res.counts[0] == 2) {
    ASSERT_EQ(res.tokens[0], draft);
    ++tally->accepted;
    ++tally->bonus[ClassOf(
        res.tokens[1], test::FakeBackend::NextToken(prompt[0], draft, kVocab))];
  }
  ASSERT_EQ(res.accepted_tokens, res.counts[0] - 1);
}

TEST(SpeculativeSampling, VerifiedDraftsKeepTheTargetDistribution) {
  constexpr int kTrials = 4000;
  // Pearson's chi-square with 3 degrees of freedom exceeds 16.27 with
  // probability 0.001; the seeds are fixed, so the test is deterministic.
  constexpr double kChi3 = 16.27;
  const std::vector<double> law = TargetLaw();
  // Drafts: the likeliest token, a tail token, one the target gives ~0.
  for (const int32_t offset : {0, 1, 7}) {
    SCOPED_TRACE(absl::StrCat("draft = predicted + ", offset));
    Tally t;
    for (int s = 0; s < kTrials; ++s) {
      RunOne(1000 + s, offset, &t);
      if (testing::Test::HasFatalFailure()) return;
    }
    EXPECT_LT(ChiSquare(t.first, law), kChi3);
    // Acceptance is a Bernoulli(p(draft)) count: within 4.5 sigma.
    const double p = offset < 3 ? law[offset] : law[3] / (kVocab - 3);
    const double sd = std::sqrt(kTrials * p * (1 - p));
    EXPECT_NEAR(t.accepted, kTrials * p, 4.5 * sd + 1);
    if (t.accepted >= 200) {
      EXPECT_LT(ChiSquare(t.bonus, law), kChi3);
    }
  }
}

}  // namespace
}  // namespace kvserve::engine
