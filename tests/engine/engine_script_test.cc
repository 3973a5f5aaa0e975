// The engine driven step by step on FakeBackend (fake_backend.h): each test
// lists what every stream got after every step (engine_script.h's Rows).
// Greedy decoding follows the fake's rule next = first + last token (mod
// 64), so prompt {2, 3} continues 5, 7, 9, ...; token 0 is EOS.
#include "tests/engine/engine_script.h"

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/fake_backend.h"

namespace kvserve::engine::test {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr FinishReason kLength = FinishReason::kLength;
constexpr FinishReason kStop = FinishReason::kStop;

TEST(EngineScriptTest, GreedyRunsToMaxTokensStopTokenAndEos) {
  Script s;
  ASSERT_TRUE(s.Submit("a", Greedy({2, 3}, 4)).ok());
  ASSERT_TRUE(s.Submit("b", Greedy({4, 1, 1}, 3)).ok());
  RequestSpec c = Greedy({2, 3}, 8);
  c.stop_token_ids = {9};
  ASSERT_TRUE(s.Submit("c", c).ok());
  ASSERT_TRUE(s.Submit("d", Greedy({1, 60}, 8)).ok());  // 61 62 63 then EOS
  ASSERT_TRUE(s.Run());

  EXPECT_THAT(s.Rows(), ElementsAreArray(std::vector<Row>{
                            {0, "a", {5}},
                            {0, "b", {5}},
                            {0, "c", {5}},
                            {0, "d", {61}},
                            {1, "a", {7}},
                            {1, "b", {9}},
                            {1, "c", {7}},
                            {1, "d", {62}},
                            {2, "a", {9}},
                            {2, "b", {13}, kLength},
                            {2, "c", {9}, kStop},
                            {2, "d", {63}},
                            {3, "a", {11}, kLength},
                            {3, "d", {0}, kStop},
                        }));
  // Token i is the i-th character of kFakeVocabChars; stop tokens and EOS
  // add no text.
  EXPECT_EQ(s.Get("a").text, "egik");
  EXPECT_EQ(s.Get("c").text, "eg");
  EXPECT_EQ(s.Get("d").text, "89+");
  EXPECT_EQ(s.Get("a").usage.prompt_tokens, 2);
  EXPECT_EQ(s.Get("a").usage.completion_tokens, 4);
  EXPECT_EQ(s.Get("d").usage.completion_tokens, 4);
  // All four prompts went in one batch, then one token each per step.
  const std::vector<StepRecord> steps = s.backend().steps();
  ASSERT_THAT(steps, SizeIs(4));
  EXPECT_EQ(steps[0].batch.num_seqs(), 4);
  EXPECT_EQ(steps[0].batch.num_tokens(), 9);
  EXPECT_EQ(steps[3].batch.num_tokens(), 2);
  EXPECT_THAT(s.backend().kv_errors(), IsEmpty());
}

// min_tokens masks EOS until it is reached; include_stop_str_in_output keeps
// the matched stop string; skip_special_tokens = false shows "<eos>".
TEST(EngineScriptTest, MinTokensStopStringsAndSpecialTokens) {
  Script s;
  RequestSpec m = Greedy({1, 60}, 8);  // 61 62 63, then EOS without min
  m.sampling.min_tokens = 5;
  ASSERT_TRUE(s.Submit("min", m).ok());
  RequestSpec cut = Greedy({2, 3}, 8);  // "egik..."
  cut.stop = {"gi"};
  ASSERT_TRUE(s.Submit("cut", cut).ok());
  RequestSpec keep = cut;
  keep.include_stop_str_in_output = true;
  ASSERT_TRUE(s.Submit("keep", keep).ok());
  RequestSpec special = Greedy({1, 60}, 6);
  special.ignore_eos = true;
  special.skip_special_tokens = false;
  ASSERT_TRUE(s.Submit("special", special).ok());
  RequestSpec skipped = special;
  skipped.skip_special_tokens = true;
  ASSERT_TRUE(s.Submit("skipped", skipped).ok());
  ASSERT_TRUE(s.Run());

  // EOS (0) masked, its runner-up 1 goes on: 1 + 1, 1 + 2, ...
  EXPECT_EQ(s.Get("min").tokens,
            (std::vector<int32_t>{61, 62, 63, 1, 2, 3, 4, 5}));
  EXPECT_EQ(s.Get("min").finish, kLength);
  EXPECT_EQ(s.Get("min").text, "89+abcde");
  EXPECT_EQ(s.Get("cut").text, "e");
  EXPECT_EQ(s.Get("cut").finish, kStop);
  EXPECT_EQ(s.Get("keep").text, "egi");
  EXPECT_EQ(s.Get("special").tokens,
            (std::vector<int32_t>{61, 62, 63, 0, 1, 2}));
  EXPECT_EQ(s.Get("special").text, "89+<eos>ab");
  EXPECT_EQ(s.Get("skipped").text, "89+ab");

  // min_tokens past max_tokens can never hold.
  RequestSpec bad = Greedy({2, 3}, 4);
  bad.sampling.min_tokens = 5;
  const absl::Status st = s.Submit("bad", bad).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              HasSubstr("min_tokens: must be in [0, max_tokens = 4], got 5"));
}

// n = 3: the prompt is computed once, each completion samples with seed +
// its index (so it equals an n = 1 request with that seed), and the
// children copy the shared, partly filled last prompt block before writing.
TEST(EngineScriptTest, ForkedCompletionsShareThePromptAndGetTheirIndex) {
  RequestSpec spec = Greedy({2, 3, 4, 5, 6}, 4);
  spec.sampling.temperature = 1.0f;
  spec.sampling.seed = 7;
  spec.ignore_eos = true;
  Script s;
  RequestSpec forked = spec;
  forked.n = 3;
  ASSERT_TRUE(s.Submit("a", forked).ok());
  ASSERT_TRUE(s.Run());

  std::vector<Row> rows = s.Rows();
  ASSERT_THAT(rows, SizeIs(12));  // 3 completions x 4 steps
  for (int32_t i = 0; i < 3; ++i) {
    const std::string name = "a#" + std::to_string(i);
    SCOPED_TRACE(name);
    for (int64_t step = 0; step < 4; ++step) {
      const Row& row = rows[step * 3 + i];
      EXPECT_EQ(row.step, step);
      EXPECT_EQ(row.stream, name);
      EXPECT_THAT(row.tokens, SizeIs(1));
      EXPECT_EQ(row.finish, step == 3 ? kLength : FinishReason::kNone);
    }
  }
  const std::vector<StepRecord> steps = s.backend().steps();
  ASSERT_THAT(steps, SizeIs(4));
  EXPECT_EQ(steps[0].batch.num_seqs(), 1);  // the prompt, once
  EXPECT_EQ(steps[0].batch.num_tokens(), 5);
  EXPECT_EQ(steps[1].batch.num_seqs(), 3);
  EXPECT_EQ(steps[1].batch.num_tokens(), 3);
  // Block 1 (prompt positions 4..) is shared three ways: the first two
  // writers copy it, the last writes in place.
  EXPECT_THAT(steps[1].copies, SizeIs(2));
  EXPECT_THAT(s.backend().kv_errors(), IsEmpty());

  // Each completion equals an n = 1 request with its seed.
  Script ref;
  for (int32_t i = 0; i < 3; ++i) {
    RequestSpec one = spec;
    one.sampling.seed = spec.sampling.seed + i;
    ASSERT_TRUE(ref.Submit("r" + std::to_string(i), one).ok());
  }
  ASSERT_TRUE(ref.Run());
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(s.Get("a#" + std::to_string(i)).tokens,
              ref.Get("r" + std::to_string(i)).tokens)
        << "completion " << i;
  }
  // The seeds differ, and so do the samples.
  EXPECT_NE(s.Get("a#0").tokens, s.Get("a#1").tokens);
  EXPECT_NE(s.Get("a#1").tokens, s.Get("a#2").tokens);
}

// kv_policy streaming: two windowed requests and a full one in each batch.
// The fake model reads t_0 (a sink) and the last token, so the window
// changes no output; its KV check follows every sequence's positions across
// the gap its drops left, so a wrong KV index or RoPE position fails it.
TEST(EngineScriptTest, WindowedRequestsKeepTheirPositionsAcrossDrops) {
  Script s;
  RequestSpec windowed = Greedy({2, 3, 4, 5, 6}, 40);
  windowed.ignore_eos = true;
  windowed.kv_window = {.sinks = 4, .window = 8};
  RequestSpec full = windowed;
  full.kv_window = {};
  ASSERT_TRUE(s.Submit("w1", windowed).ok());
  ASSERT_TRUE(s.Submit("w2", windowed).ok());
  ASSERT_TRUE(s.Submit("f", full).ok());
  ASSERT_TRUE(s.Run());
  EXPECT_THAT(s.backend().kv_errors(), IsEmpty());
  EXPECT_THAT(s.Get("w1").tokens, SizeIs(40));
  EXPECT_EQ(s.Get("w1").tokens, s.Get("f").tokens);
  EXPECT_EQ(s.Get("w2").tokens, s.Get("f").tokens);
  EXPECT_GT(s.Get("w1").usage.kv.dropped_tokens, 20);
  EXPECT_EQ(s.Get("f").usage.kv.dropped_tokens, 0);
  EXPECT_LE(s.Get("w1").usage.kv.peak_blocks, 5);  // sinks + 8 + 1 block
}

// A 20-token prompt prefilled 8 tokens a step, aborted after its second
// chunk: it ends cancelled without a token, and the request queued behind it
// runs once the budget is free.
TEST(EngineScriptTest, AbortMidPrefill) {
  EngineConfig config = SmallConfig();
  config.scheduler.max_num_batched_tokens = 8;
  Script s(config);
  std::vector<int32_t> prompt(20, 1);
  prompt[0] = 2;
  absl::StatusOr<RequestId> a = s.Submit("a", Greedy(prompt, 4));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(s.Submit("b", Greedy({2, 3}, 3)).ok());
  s.backend().At(1, [&](const StepRecord&) {
    s.engine().Abort(*a);
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.Run());

  EXPECT_THAT(s.Rows(), ElementsAreArray(std::vector<Row>{
                            {1, "a", {}, FinishReason::kCancelled},
                            {2, "b", {5}},
                            {3, "b", {7}},
                            {4, "b", {9}, kLength},
                        }));
  EXPECT_EQ(s.Get("a").usage.completion_tokens, 0);
  const std::vector<StepRecord> steps = s.backend().steps();
  ASSERT_THAT(steps, SizeIs(5));
  for (int step : {0, 1}) {
    EXPECT_EQ(steps[step].batch.num_seqs(), 1) << "step " << step;
    EXPECT_EQ(steps[step].batch.num_tokens(), 8) << "step " << step;
    EXPECT_THAT(steps[step].batch.logits_rows, IsEmpty()) << "step " << step;
  }
  // b alone, its first token a cached tail from a's first block.
  EXPECT_EQ(steps[2].batch.num_tokens(), 1);
  EXPECT_THAT(s.backend().kv_errors(), IsEmpty());
}

// Deadlines end a request wherever it is, counted by phase: "c" expired on
// arrival and "b", waiting behind max_num_seqs, never reached the model
// (queued); "a" was decoding and "p" half way through its chunked prefill
// (running). "f" runs on.
TEST(EngineScriptTest, DeadlinesExpireWhileQueuedAndWhileRunning) {
  EngineConfig config = SmallConfig();
  config.scheduler.max_num_seqs = 3;
  config.scheduler.max_num_batched_tokens = 8;
  Script s(config);
  ASSERT_TRUE(s.Submit("f", Greedy({2, 3}, 8)).ok());
  RequestSpec c = Greedy({2, 3}, 4);
  c.deadline = absl::Now() - absl::Seconds(1);
  ASSERT_TRUE(s.Submit("c", c).ok());
  // Submitted during step 0, so taken (and "a" and "p" scheduled) right
  // after it; the deadline passes during step 2.
  absl::Time deadline;
  s.backend().At(0, [&](const StepRecord&) {
    deadline = absl::Now() + absl::Milliseconds(50);
    RequestSpec a = Greedy({4, 1}, 8), p = Greedy(std::vector(20, 1), 4),
                b = Greedy({6, 1}, 8);
    a.deadline = p.deadline = b.deadline = deadline;
    EXPECT_TRUE(s.Submit("a", a).ok());
    EXPECT_TRUE(s.Submit("p", p).ok());
    EXPECT_TRUE(s.Submit("b", b).ok());
    return absl::OkStatus();
  });
  s.backend().At(2, [&](const StepRecord&) {
    absl::SleepFor(deadline - absl::Now() + absl::Milliseconds(1));
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.Run());

  constexpr FinishReason kDeadline = FinishReason::kDeadline;
  EXPECT_THAT(s.Rows(), ElementsAreArray(std::vector<Row>{
                            {-1, "c", {}, kDeadline},
                            {0, "f", {5}},
                            {1, "a", {5}},
                            {1, "f", {7}},
                            {2, "a", {9}, kDeadline},
                            {2, "b", {}, kDeadline},
                            {2, "f", {9}},
                            {2, "p", {}, kDeadline},
                            {3, "f", {11}},
                            {4, "f", {13}},
                            {5, "f", {15}},
                            {6, "f", {17}},
                            {7, "f", {19}, kLength},
                        }));
  // Steps 1 and 2: "f" and "a" decode, "p" prefills the rest of the budget.
  const std::vector<StepRecord> steps = s.backend().steps();
  ASSERT_THAT(steps, SizeIs(8));
  for (int step : {1, 2}) {
    EXPECT_EQ(steps[step].batch.num_seqs(), 3) << "step " << step;
    EXPECT_EQ(steps[step].batch.num_tokens(), 8) << "step " << step;
  }
  const char* kMetric = "kvserve_deadline_exceeded_total";
  EXPECT_EQ(MetricValue(s.registry(), kMetric, "phase", "queued"), 2);
  EXPECT_EQ(MetricValue(s.registry(), kMetric, "phase", "running"), 2);
}

// A failed forward fails the requests in its batch with its error; the
// engine serves the next request, whose prompt hits the prefix cache the
// failed requests filled before the fault.
TEST(EngineScriptTest, FailedForwardFailsItsBatchAndServesOn) {
  const std::vector<int32_t> prompt = {2, 3, 5, 7, 9, 11, 13, 15, 17};
  Script s;
  ASSERT_TRUE(s.Submit("a", Greedy(prompt, 4)).ok());
  ASSERT_TRUE(s.Submit("b", Greedy({4, 1}, 4)).ok());
  s.backend().At(1, [&](const StepRecord&) {
    EXPECT_TRUE(s.Submit("c", Greedy(prompt, 3)).ok());
    return absl::InternalError("injected fault");
  });
  ASSERT_TRUE(s.Run());

  constexpr FinishReason kError = FinishReason::kError;
  EXPECT_THAT(s.Rows(), ElementsAreArray(std::vector<Row>{
                            {0, "a", {19}},
                            {0, "b", {5}},
                            {1, "a", {}, kError},
                            {1, "b", {}, kError},
                            {2, "c", {19}},
                            {3, "c", {21}},
                            {4, "c", {23}, kLength},
                        }));
  EXPECT_THAT(s.Get("a").error, HasSubstr("injected fault"));
  EXPECT_THAT(s.Get("b").error, HasSubstr("injected fault"));
  // "c" found the prompt's two full blocks cached and computed one token.
  EXPECT_EQ(s.Get("c").usage.cached_prompt_tokens, 8);
  const std::vector<StepRecord> steps = s.backend().steps();
  ASSERT_THAT(steps, SizeIs(5));
  EXPECT_EQ(steps[2].batch.num_tokens(), 1);
  EXPECT_THAT(s.backend().kv_errors(), IsEmpty());
}

// Three requests of 6 + 10 tokens (4 blocks each) in a pool of 8 blocks:
// when they need a third block (step 3), "c", admitted last, is preempted;
// it resumes once "a" and "b" have finished (step 10). Its output equals
// that of a pool where nothing is preempted, and the fake's KV checks prove
// that the moves put every block back where it belongs.
struct PreemptionCase {
  std::string mode;
  int32_t swap_slots;
};
void PrintTo(const PreemptionCase& c, std::ostream* os) {
  *os << c.mode << " with " << c.swap_slots << " swap slots";
}

class PreemptionTest : public ::testing::TestWithParam<PreemptionCase> {
 protected:
  static void SubmitAll(Script& s) {
    ASSERT_TRUE(s.Submit("a", Greedy({2, 1, 1, 1, 1, 3}, 10)).ok());
    ASSERT_TRUE(s.Submit("b", Greedy({4, 1, 1, 1, 1, 1}, 10)).ok());
    ASSERT_TRUE(s.Submit("c", Greedy({6, 1, 1, 1, 1, 1}, 10)).ok());
  }
  static std::vector<Row> RowsOf(const std::vector<Row>& rows,
                                 const std::string& stream) {
    std::vector<Row> out;
    for (const Row& r : rows) {
      if (r.stream == stream) out.push_back(r);
    }
    return out;
  }
};

TEST_P(PreemptionTest, OutputsEqualAnUnpreemptedRun) {
  EngineConfig config = SmallConfig();
  config.scheduler.preemption_mode =
      scheduler::ParsePreemptionMode(GetParam().mode).value();
  // Without the prefix cache a recomputed request really recomputes.
  config.scheduler.enable_prefix_caching = false;
  Script big(config, {.num_blocks = 32});
  SubmitAll(big);
  ASSERT_TRUE(big.Run());
  Script small(config,
               {.num_blocks = 8, .num_swap_slots = GetParam().swap_slots});
  SubmitAll(small);
  ASSERT_TRUE(small.Run());

  EXPECT_THAT(RowsOf(small.Rows(), "c"), ElementsAreArray(std::vector<Row>{
                                             {0, "c", {7}},
                                             {1, "c", {13}},
                                             {2, "c", {19}},
                                             {10, "c", {25}},
                                             {11, "c", {31}},
                                             {12, "c", {37}},
                                             {13, "c", {43}},
                                             {14, "c", {49}},
                                             {15, "c", {55}},
                                             {16, "c", {61}, kLength},
                                         }));
  for (const char* name : {"a", "b", "c"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(small.Get(name).finish, kLength);
    EXPECT_THAT(small.Get(name).tokens, SizeIs(10));
    EXPECT_EQ(small.Get(name).tokens, big.Get(name).tokens);
  }
  EXPECT_THAT(small.backend().kv_errors(), IsEmpty());
  const std::vector<StepRecord> steps = small.backend().steps();
  ASSERT_THAT(steps, SizeIs(17));
  const char* kMetric = "kvserve_preemptions_total";
  if (GetParam().mode == "swap") {
    EXPECT_EQ(MetricValue(small.registry(), kMetric, "mode", "swap"), 1);
    // "c"'s two blocks go out before step 3 and come back before step 10,
    // from the slots they went to.
    ASSERT_THAT(steps[3].swap_out, SizeIs(2));
    ASSERT_THAT(steps[10].swap_in, SizeIs(2));
    std::vector<int32_t> out_slots, in_slots;
    for (int i = 0; i < 2; ++i) {
      out_slots.push_back(steps[3].swap_out[i].dst);
      in_slots.push_back(steps[10].swap_in[i].src);
    }
    EXPECT_EQ(in_slots, out_slots);
    EXPECT_EQ(steps[10].batch.num_tokens(), 1);
  } else {
    EXPECT_EQ(MetricValue(small.registry(), kMetric, "mode", "recompute"), 1);
    // Its 6 prompt and 3 output tokens again.
    EXPECT_EQ(steps[10].batch.num_tokens(), 9);
  }
  int64_t moves = 0;
  for (const StepRecord& r : steps) {
    moves += static_cast<int64_t>(r.swap_out.size() + r.swap_in.size());
  }
  EXPECT_EQ(moves, GetParam().mode == "swap" ? 4 : 0);
  EXPECT_EQ(MetricValue(big.registry(), kMetric, "mode", "swap") +
                MetricValue(big.registry(), kMetric, "mode", "recompute"),
            0);
}

INSTANTIATE_TEST_SUITE_P(Modes, PreemptionTest,
                         ::testing::Values(PreemptionCase{"swap", 8},
                                           PreemptionCase{"recompute", 0}),
                         [](const auto& info) { return info.param.mode; });

// Submit is where a spec's limits are checked: each error names the spec
// field and its limit, and nothing is queued.
TEST(EngineScriptTest, SubmitRefusesEachLimitNamingTheField) {
  FakeBackend::Options big;
  big.num_blocks = 128;  // 512 tokens: past the model's context of 256
  EngineConfig config = SmallConfig();
  config.scheduler.max_num_seqs = 16;
  Script s(config, big);
  struct Case {
    const char* name;
    RequestSpec spec;
    const char* message;
  };
  RequestSpec n0 = Greedy({2, 3}, 4);
  n0.n = 0;
  RequestSpec n17 = Greedy({2, 3}, 4);
  n17.n = 17;
  RequestSpec stop = Greedy({2, 3}, 4);
  stop.stop_token_ids = {1, 64};
  // Each completion is a sequence: n cannot pass what runs at once.
  Script four(SmallConfig(), big);
  RequestSpec n5 = Greedy({2, 3}, 4);
  n5.n = 5;
  const absl::Status over = four.Submit("n5", n5).status();
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument) << over;
  EXPECT_THAT(over.message(),
              HasSubstr("n: 5 completions, over the server's limit of 4 "
                        "sequences (--max-num-seqs)"));
  const std::vector<Case> cases = {
      {"empty prompt", Greedy({}, 4), "prompt: must not be empty"},
      {"max_tokens 0", Greedy({2, 3}, 0), "max_tokens: must be >= 1, got 0"},
      {"n 0", n0, "n: must be in [1, 16], got 0"},
      {"n 17", n17, "n: must be in [1, 16], got 17"},
      {"prompt id", Greedy({2, 64}, 4),
       "prompt_token_ids[1]: unknown token id 64 (the vocabulary is [0, 64))"},
      {"negative id", Greedy({-1}, 4),
       "prompt_token_ids[0]: unknown token id -1"},
      {"stop id", stop, "stop_token_ids[1]: unknown token id 64"},
      {"prompt at the context", Greedy(std::vector<int32_t>(256, 1), 1),
       "prompt: 256 tokens, over the model's context of 256"},
      {"past the context", Greedy(std::vector<int32_t>(250, 1), 7),
       "max_tokens: prompt (250 tokens) + max_tokens (7) exceeds the "
       "model's context of 256"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const absl::Status st = s.Submit(c.name, c.spec).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(st.message(), HasSubstr(c.message));
  }
  // The limits themselves are accepted.
  ASSERT_TRUE(s.Submit("full", Greedy(std::vector<int32_t>(250, 1), 6)).ok());
  RequestSpec sixteen = Greedy({2, 3}, 1);
  sixteen.n = 16;
  ASSERT_TRUE(s.Submit("n16", sixteen).ok());
  s.Start();
  ASSERT_TRUE(s.WaitAll(absl::Seconds(10)));

  // A request the pool (16 blocks of 4) can never hold is out of range.
  Script small;
  const absl::Status st = small.Submit("big", Greedy({2, 3}, 63)).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_THAT(st.message(), HasSubstr("can never fit the KV cache"));
}

// Drain lets what was submitted finish, queued requests included, and
// refuses new ones.
TEST(EngineScriptTest, DrainFinishesInFlightRequestsAndRefusesNewOnes) {
  EngineConfig config = SmallConfig();
  config.scheduler.max_num_seqs = 1;
  Script s(config);
  ASSERT_TRUE(s.Submit("a", Greedy({2, 3}, 4)).ok());
  ASSERT_TRUE(s.Submit("b", Greedy({4, 1}, 3)).ok());
  absl::Status late;
  s.backend().At(1, [&](const StepRecord&) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!s.engine().draining() && absl::Now() < give_up) {
      absl::SleepFor(absl::Microseconds(100));
    }
    late = s.Submit("late", Greedy({2, 3}, 1)).status();
    return absl::OkStatus();
  });
  s.Start();
  s.engine().Drain(absl::Seconds(10));

  EXPECT_EQ(late.code(), absl::StatusCode::kUnavailable) << late;
  EXPECT_THAT(s.Rows(), ElementsAreArray(std::vector<Row>{
                            {0, "a", {5}},
                            {1, "a", {7}},
                            {2, "a", {9}},
                            {3, "a", {11}, kLength},
                            {4, "b", {5}},
                            {5, "b", {9}},
                            {6, "b", {13}, kLength},
                        }));
  EXPECT_EQ(s.Submit("after", Greedy({2, 3}, 1)).status().code(),
            absl::StatusCode::kUnavailable);
}

// Drain past its timeout cancels what is left: the running request with the
// tokens it has, the queued one with none.
TEST(EngineScriptTest, DrainTimeoutCancelsTheRest) {
  EngineConfig config = SmallConfig();
  config.scheduler.max_num_seqs = 1;
  Script s(config, {.num_blocks = 64});
  ASSERT_TRUE(s.Submit("a", Greedy({2, 3}, 100)).ok());
  ASSERT_TRUE(s.Submit("b", Greedy({4, 1}, 4)).ok());
  // From step 2 on, once draining, every step takes a millisecond: "a"
  // cannot finish its 100 tokens within the drain's 20 ms.
  s.backend().At(2, [&](const StepRecord&) {
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!s.engine().draining() && absl::Now() < give_up) {
      absl::SleepFor(absl::Microseconds(100));
    }
    return absl::OkStatus();
  });
  for (int64_t step = 3; step < 100; ++step) {
    s.backend().At(step, [](const StepRecord&) {
      absl::SleepFor(absl::Milliseconds(1));
      return absl::OkStatus();
    });
  }
  s.Start();
  const absl::Time t0 = absl::Now();
  s.engine().Drain(absl::Milliseconds(20));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
  ASSERT_TRUE(s.WaitAll());

  const Completion a = s.Get("a");
  EXPECT_EQ(a.finish, FinishReason::kCancelled);
  ASSERT_GE(a.tokens.size(), 3u);
  ASSERT_LT(a.tokens.size(), 100u);
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    EXPECT_EQ(a.tokens[i], (5 + 2 * static_cast<int32_t>(i)) % kFakeVocab)
        << "token " << i;
  }
  EXPECT_EQ(s.Get("b").finish, FinishReason::kCancelled);
  EXPECT_THAT(s.Get("b").tokens, IsEmpty());
  EXPECT_EQ(s.Submit("after", Greedy({2, 3}, 1)).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvserve::engine::test
