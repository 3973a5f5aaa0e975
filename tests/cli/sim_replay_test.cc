// `kvserve sim-replay` (cli/sim_replay.h, cli/sim_trace.h): trace files and
// their errors, the seeded synthetic traces, and replays through the real
// engine on the simulated device in virtual time: deterministic, a lone
// request's TTFT exactly its prefill step's roofline time, shared prefixes
// hit the prefix cache, an overfull pool preempts.
#include "cli/sim_replay.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>

#include "absl/time/clock.h"
#include "cli/sim_profile.h"
#include "engine/runner/loaded_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/loader/presets.h"
#include "models/sim/roofline.h"

namespace kvserve::cli {
namespace {

using ::testing::HasSubstr;

std::string WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(SimTraceTest, ReadsJsonLines) {
  const std::string path =
      WriteFile("ok.jsonl",
                "# arrivals in seconds\n"
                "{\"arrival\": 0, \"input_len\": 100, \"output_len\": 10}\n"
                "\n"
                "{\"arrival\": 0.5, \"input_len\": 300, \"output_len\": 20, "
                "\"prefix_id\": 2, \"prefix_len\": 256}\n");
  absl::StatusOr<std::vector<TraceRequest>> t = ReadTrace(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].prefix_id, -1);
  EXPECT_EQ((*t)[1].arrival, 0.5);
  EXPECT_EQ((*t)[1].input_len, 300);
  EXPECT_EQ((*t)[1].prefix_id, 2);
  EXPECT_EQ((*t)[1].prefix_len, 256);
}

TEST(SimTraceTest, ErrorsNameTheLineAndTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {"{\"arrival\": 0, \"input_len\": 5}", ":1: \"output_len\" is required"},
      {"{\"arrival\": -1, \"input_len\": 5, \"output_len\": 1}",
       ":1: \"arrival\" must be a number"},
      {"{\"arrival\": 1, \"input_len\": 5, \"output_len\": 1}\n"
       "{\"arrival\": 0.5, \"input_len\": 5, \"output_len\": 1}",
       ":2: \"arrival\" 0.5 is before"},
      {"{\"arrival\": 0, \"input_len\": 5, \"output_len\": 1, "
       "\"prefix_id\": 1, \"prefix_len\": 9}",
       "\"prefix_len\" 9 exceeds \"input_len\" 5"},
      {"not json", ":1: not a JSON object"},
      {"# only a comment", "no requests"},
  };
  for (const auto& [text, want] : cases) {
    absl::StatusOr<std::vector<TraceRequest>> t =
        ReadTrace(WriteFile("bad.jsonl", text));
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr(want));
    EXPECT_THAT(t.status().message(), HasSubstr("--trace"));
  }
  EXPECT_EQ(ReadTrace("/nonexistent/trace.jsonl").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SimTraceTest, SyntheticTracesAreSeeded) {
  SyntheticTraceSpec spec;
  spec.num_requests = 2000;
  spec.request_rate = 10;
  spec.input_sigma = 0.5;
  spec.num_prefixes = 4;
  spec.prefix_len = 64;
  const std::vector<TraceRequest> a = SyntheticTrace(spec);
  const std::vector<TraceRequest> b = SyntheticTrace(spec);
  ASSERT_EQ(a.size(), 2000u);
  EXPECT_EQ(a.back().arrival, b.back().arrival);
  // 1,999 exponential gaps of mean 0.1 s.
  EXPECT_NEAR(a.back().arrival, 199.9, 15);
  EXPECT_EQ(a[5].prefix_id, 1);
  EXPECT_GT(a[5].input_len, 64);
  spec.seed = 1;
  EXPECT_NE(SyntheticTrace(spec).back().arrival, a.back().arrival);
  // Prompts: a prefix's tokens are shared, the rest are the request's own.
  const std::vector<int32_t> p1 = TracePrompt(a[1], 1, 0, 128256);
  const std::vector<int32_t> p5 = TracePrompt(a[5], 5, 0, 128256);
  ASSERT_EQ(static_cast<int32_t>(p5.size()), a[5].input_len);
  EXPECT_TRUE(std::equal(p1.begin(), p1.begin() + 64, p5.begin()));
  EXPECT_NE(p1[64], p5[64]);
}

engine::EngineConfig SimConfig(const char* device) {
  engine::EngineConfig e;
  e.device = engine::Device::kSim;
  e.sim = *engine::ParseSimTarget(device);
  e.scheduler.max_num_seqs = 256;
  e.scheduler.max_num_batched_tokens = 4096;
  return e;
}

absl::StatusOr<ReplayResult> Replay(const engine::EngineConfig& e,
                                    const std::vector<TraceRequest>& trace) {
  absl::StatusOr<engine::LoadedModel> m =
      engine::LoadModel("llama3-8b", engine::Device::kSim);
  if (!m.ok()) return m.status();
  return ReplayTrace(e, *std::move(m), trace, 7);
}

TEST(SimReplayTest, ALoneRequestTakesItsRooflinePrefillThenDecodeSteps) {
  // Two requests an hour apart: each meets an idle engine.
  const std::vector<TraceRequest> trace = {{0, 1000, 8}, {3600, 1000, 8}};
  absl::StatusOr<ReplayResult> r = Replay(SimConfig("sim:h100"), trace);
  ASSERT_TRUE(r.ok()) << r.status();
  const models::ModelConfig c = models::FindPreset("llama3-8b")->config;
  const models::sim::Roofline roofline(
      c, *models::sim::FindGpu("h100"), 1, 2.0,
      kvcache::KvBytesPerToken(models::KvShapeOf(c), kvcache::KvDtype::kBF16));
  // The prompt runs in 4 chunks (below), each with the host's time for its
  // one sequence.
  const double host = models::sim::Efficiency{}.host_s_per_seq;
  const double prefill =
      roofline.Step({.tokens = 1000, .attended = 1000 * 1001 / 2}).total_s +
      4 * host;
  double e2e = prefill;
  for (int t = 1001; t < 1008; ++t) {
    e2e += roofline
               .Step({.tokens = 1,
                      .attended = t,
                      .kv_read_tokens = t - 1,
                      .seqs = 1})
               .total_s;
  }
  for (const ReplayedRequest& q : r->requests) {
    EXPECT_TRUE(q.ok);
    EXPECT_EQ(q.output_tokens, 8);
    EXPECT_NEAR(q.ttft, prefill, 1e-6);
    EXPECT_NEAR(q.e2e, e2e, 1e-6);
  }
  EXPECT_NEAR(r->virtual_seconds, 3600 + e2e, 1e-6);
  // The prompt runs in 4 chunks of <= 256 tokens (the scheduler's
  // long_prefill_token_threshold), each compute-bound on an H100, so their
  // times sum to one 1,000-token prefill's; then 7 decode steps.
  EXPECT_EQ(r->steps, 2 * (4 + 7));
  EXPECT_EQ(r->samples.size(), 22u);
}

TEST(SimReplayTest, DeterministicWithPrefixHitsAndPreemptions) {
  SyntheticTraceSpec spec;
  spec.num_requests = 300;
  spec.request_rate = 50;
  spec.input_len = 600;
  spec.output_len = 200;
  spec.output_sigma = 0.5;
  spec.num_prefixes = 3;
  spec.prefix_len = 512;
  const std::vector<TraceRequest> trace = SyntheticTrace(spec);
  engine::EngineConfig e = SimConfig("sim:h100");
  e.kv_cache_bytes = int64_t{2} << 30;  // ~16K tokens: the trace overfills it
  absl::StatusOr<ReplayResult> a = Replay(e, trace);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<ReplayResult> b = Replay(e, trace);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->steps, b->steps);
  // Every step is recorded, the last one (whose record follows the last
  // request's finish) included.
  EXPECT_EQ(static_cast<int64_t>(a->step_log.size()), a->steps);
  int64_t cached = 0, preemptions = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const ReplayedRequest& x = a->requests[i];
    EXPECT_TRUE(x.ok);
    EXPECT_EQ(x.output_tokens, trace[i].output_len);
    EXPECT_EQ(x.ttft, b->requests[i].ttft);
    EXPECT_EQ(x.e2e, b->requests[i].e2e);
    cached += x.cached_tokens;
    preemptions += x.preemptions;
  }
  EXPECT_GT(cached, 100 * 512);
  EXPECT_GT(preemptions, 0);
  const std::string summary = FormatReplaySummary(*a, "t");
  EXPECT_THAT(summary, HasSubstr("Successful requests:"));
  EXPECT_THAT(summary, HasSubstr("TTFT"));
  const std::string csv = FormatReplayTimeseries(*a);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'),
            static_cast<long>(a->samples.size()) + 1);
  EXPECT_THAT(FormatReplayJson(*a), HasSubstr("\"preemptions\":"));
}

// Requests that arrive together reach the engine in one inbox: an
// all-at-once trace replays to the same steps every time (the first step
// does not depend on how many the feeder had submitted when it began).
TEST(SimReplayTest, AllAtOnceArrivalsReplayIdentically) {
  SyntheticTraceSpec spec;
  spec.num_requests = 400;
  spec.input_len = 128;
  spec.output_len = 16;
  const std::vector<TraceRequest> trace = SyntheticTrace(spec);
  std::vector<int64_t> first;
  for (int run = 0; run < 3; ++run) {
    absl::StatusOr<ReplayResult> r = Replay(SimConfig("sim:h100"), trace);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->step_log.empty());
    std::vector<int64_t> tokens;
    for (const engine::StepRecord& s : r->step_log) {
      tokens.push_back(s.load.tokens);
    }
    if (run == 0) {
      first = tokens;
      // The first step is as full as the token budget allows.
      EXPECT_EQ(tokens[0],
                SimConfig("sim:h100").scheduler.max_num_batched_tokens);
    } else {
      EXPECT_EQ(tokens, first) << "run " << run;
    }
  }
}

// The same driver on a real device runs in real time: each request is
// submitted at its arrival, and every step is recorded with its load. (What
// a run's steps determine depends on its timing, so the profile fit is
// checked on steps of a known profile below.)
TEST(SimReplayTest, RunsARealDeviceInRealTime) {
  absl::StatusOr<engine::LoadedModel> m = engine::LoadModel(
      KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf",
      engine::Device::kCpu);
  ASSERT_TRUE(m.ok()) << m.status();
  engine::EngineConfig e;
  e.kv_cache_bytes = 64 << 20;
  std::vector<TraceRequest> trace;
  trace.reserve(6);
  for (int i = 0; i < 6; ++i) trace.push_back({0.05 * i, 20 + 30 * i, 6});
  const absl::Time t0 = absl::Now();
  absl::StatusOr<ReplayResult> r = ReplayTrace(e, *std::move(m), trace, 3);
  ASSERT_TRUE(r.ok()) << r.status();
  // The last request arrives 0.25 s in: the run cannot be shorter.
  EXPECT_GE(absl::ToDoubleSeconds(absl::Now() - t0), 0.25);
  for (const ReplayedRequest& q : r->requests) {
    EXPECT_TRUE(q.ok);
    EXPECT_EQ(q.output_tokens, 6);
    EXPECT_GT(q.ttft, 0);
  }
  // A prefill and 5 decode steps for the last request at least.
  ASSERT_GE(r->step_log.size(), 6u);
  for (const engine::StepRecord& s : r->step_log) {
    EXPECT_GT(s.seconds, 0);
    EXPECT_GE(s.seconds, s.forward_seconds);
    EXPECT_GE(s.load.tokens, s.load.seqs);
  }
}

// A profile fitted to steps and written reads back as the profile that
// timed them.
TEST(SimReplayTest, StepProfilesRoundTripThroughTheirFile) {
  const models::sim::StepProfile truth{5e-3, 6e-4, 1e-5, 8e-7, 7e-7, 2e-3};
  std::vector<engine::StepRecord> steps;
  for (int64_t seqs = 1; seqs <= 16; seqs *= 2) {
    for (int64_t ctx = 64; ctx <= 1024; ctx *= 2) {
      engine::StepRecord r;
      r.load = {seqs, seqs * ctx, seqs * (ctx - 1), seqs};
      r.seconds = truth.Seconds(r.load);
      steps.push_back(r);
    }
  }
  for (int64_t n = 32; n <= 256; n *= 2) {
    engine::StepRecord r;
    r.load = {n + 2, n * (n + 1) / 2 + 400, 398, 3};
    r.seconds = truth.Seconds(r.load);
    steps.push_back(r);
  }
  const std::string path = ::testing::TempDir() + "/profile.json";
  ASSERT_TRUE(WriteStepProfile(path, "cpu", "smollm2", steps).ok());
  absl::StatusOr<models::sim::StepProfile> p = ReadStepProfile(path);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_NEAR(p->base_s, truth.base_s, 1e-9);
  EXPECT_NEAR(p->per_token_s, truth.per_token_s, 1e-10);
  EXPECT_NEAR(p->prefill_s, truth.prefill_s, 1e-9);
  for (const engine::StepRecord& r : steps) {
    EXPECT_NEAR(p->Seconds(r.load), r.seconds, 1e-9);
  }
  // Two steps cannot determine six coefficients.
  steps.resize(2);
  EXPECT_FALSE(WriteStepProfile(path, "cpu", "smollm2", steps).ok());
  EXPECT_THAT(ReadStepProfile(WriteFile("bad.json", "{\"kind\": \"x\"}"))
                  .status()
                  .message(),
              HasSubstr("not a step profile"));
  EXPECT_THAT(
      ReadStepProfile(
          WriteFile("bad2.json",
                    "{\"kind\": \"kvserve-step-profile\", \"version\": 1, "
                    "\"seconds\": {\"base\": 1}}"))
          .status()
          .message(),
      HasSubstr("\"seconds\".\"per_token\" must be a finite number"));
}

// The validation no separate simulator can pass: a real run on the CPU
// (the default model, a pool too small for the trace: preemptions by
// recompute, shared prefixes: prefix hits) recorded, then replayed on the
// simulated device on the recorded timeline (each step as long as it took,
// each request arriving when the engine stamped it). Every step schedules
// the same batch, and every request the same preemptions, prefix hits and
// peak KV. Without the timeline (the sim's own step times) the steps differ.
TEST(SimReplayTest, ReplaysARealRunsTimelineStepForStep) {
  const char* model =
      KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
  SyntheticTraceSpec spec;
  spec.num_requests = 16;
  spec.request_rate = 40;
  spec.input_len = 80;
  spec.output_len = 24;
  spec.input_sigma = 0.4;
  spec.output_sigma = 0.4;
  spec.num_prefixes = 2;
  spec.prefix_len = 32;
  spec.seed = 11;
  const std::vector<TraceRequest> trace = SyntheticTrace(spec);
  engine::EngineConfig e;
  e.scheduler.max_num_seqs = 8;
  e.scheduler.max_num_batched_tokens = 128;
  e.scheduler.preemption_mode = scheduler::PreemptionMode::kRecompute;
  e.swap_space_bytes = 0;
  // 24 blocks of 16 tokens (23,040 bytes a token: CPU fp16, sim bf16).
  e.kv_cache_dtype = kvcache::KvDtype::kF16;
  e.kv_cache_bytes = int64_t{24} * 16 * 23040;
  absl::StatusOr<engine::LoadedModel> cpu_model =
      engine::LoadModel(model, engine::Device::kCpu);
  ASSERT_TRUE(cpu_model.ok()) << cpu_model.status();
  absl::StatusOr<ReplayResult> real =
      ReplayTrace(e, *std::move(cpu_model), trace, 5);
  ASSERT_TRUE(real.ok()) << real.status();

  std::vector<TraceRequest> recorded = trace;
  for (size_t i = 0; i < trace.size(); ++i) {
    recorded[i].arrival = real->requests[i].arrival;
  }
  e.device = engine::Device::kSim;
  e.sim = *engine::ParseSimTarget("sim:h100");
  e.kv_cache_dtype = kvcache::KvDtype::kBF16;
  const auto replay = [&](const std::vector<double>& timeline) {
    absl::StatusOr<engine::LoadedModel> m =
        engine::LoadModel(model, engine::Device::kSim);
    EXPECT_TRUE(m.ok()) << m.status();
    return ReplayTrace(e, *std::move(m), recorded, 5, timeline);
  };
  absl::StatusOr<ReplayResult> sim = replay(real->step_starts);
  ASSERT_TRUE(sim.ok()) << sim.status();

  ASSERT_EQ(sim->step_log.size(), real->step_log.size());
  for (size_t k = 0; k < real->step_log.size(); ++k) {
    const models::sim::StepLoad& a = real->step_log[k].load;
    const models::sim::StepLoad& b = sim->step_log[k].load;
    ASSERT_EQ(std::tie(a.tokens, a.seqs, a.attended, a.kv_read_tokens),
              std::tie(b.tokens, b.seqs, b.attended, b.kv_read_tokens))
        << "step " << k;
    EXPECT_EQ(real->samples[k].blocks_active, sim->samples[k].blocks_active)
        << "step " << k;
  }
  int64_t preemptions = 0, cached = 0;
  for (size_t i = 0; i < trace.size(); ++i) {
    const ReplayedRequest& x = real->requests[i];
    const ReplayedRequest& y = sim->requests[i];
    EXPECT_TRUE(x.ok && y.ok) << i;
    EXPECT_EQ(x.preemptions, y.preemptions) << i;
    EXPECT_EQ(x.cached_tokens, y.cached_tokens) << i;
    EXPECT_DOUBLE_EQ(x.arrival, y.arrival) << i;
    preemptions += x.preemptions;
    cached += x.cached_tokens;
  }
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(cached, 0);

  // The H100's own step times are far shorter than the CPU's: the same
  // arrivals meet other batches.
  absl::StatusOr<ReplayResult> own = replay({});
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_NE(own->step_log.size(), real->step_log.size());
}

}  // namespace
}  // namespace kvserve::cli
