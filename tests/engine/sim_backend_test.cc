// The simulated device (engine/sim_backend.h): --device parsing, the pool
// sized as `kvserve plan --gpu` sizes it, seeded batch-invariant token ids,
// steps that last at least their roofline time, and the real engine's
// scheduling on it: the same trace on the CPU engine with the real model
// and on the sim backend makes the same decisions (preemptions, prefix
// hits, peak blocks, steps).
#include "engine/runner/sim_backend.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "engine/runner/loaded_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/loader/presets.h"
#include "models/sim/roofline.h"
#include "models/tokenizer/synthetic_tokenizer.h"

namespace kvserve::engine {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(SimDeviceTest, ParsesGpuAndRanks) {
  absl::StatusOr<SimConfig> a = ParseSimTarget("sim:h200");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->gpu, "h200");
  EXPECT_EQ(a->tp, 1);
  SimConfig base;
  base.speed = 7;
  absl::StatusOr<SimConfig> b = ParseSimTarget("sim:H100x4", base);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->gpu, "h100");
  EXPECT_EQ(b->tp, 4);
  EXPECT_EQ(b->speed, 7);  // the rest of `base` kept
  absl::StatusOr<Device> d = ParseDevice("sim:l40sx2");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, Device::kSim);
}

TEST(SimDeviceTest, BadTargetsNameTheFlagAndTheGpus) {
  for (const char* bad :
       {"sim:", "sim:tpu", "sim:h200x0", "sim:h200xa", "sim:h200x65"}) {
    absl::StatusOr<Device> d = ParseDevice(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(d.status().message(), HasSubstr("--device"));
    EXPECT_THAT(d.status().message(), HasSubstr("h200"));
  }
}

BackendConfig SimBackendConfig(const char* target, double weight_bytes) {
  BackendConfig c;
  c.device = Device::kSim;
  c.block_size = 16;
  c.sim = *ParseSimTarget(target);
  c.sim.weight_bytes = weight_bytes;
  c.sim.speed = 0;
  return c;
}

absl::StatusOr<std::unique_ptr<ModelBackend>> Llama70b(const char* target,
                                                       double weight_bytes,
                                                       LoadedModel* model) {
  absl::StatusOr<LoadedModel> m = LoadModel("llama3-70b", Device::kSim);
  if (!m.ok()) return m.status();
  *model = *std::move(m);
  return CreateBackend(SimBackendConfig(target, weight_bytes), model);
}

// Llama-3-70B: 70,553,706,496 parameters, 327,680 KV bytes a token in bf16
// (160 KiB per rank at tp=2); an H200 holds 141 GB, 14.1 GB kept back.
TEST(SimBackendTest, PoolIsTheGpuMemoryLeftAfterWeightsAsPlanSizesIt) {
  LoadedModel model;
  absl::StatusOr<std::unique_ptr<ModelBackend>> fp8 =
      Llama70b("sim:h200", 1.0, &model);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(model.format, "preset");
  EXPECT_EQ((*fp8)->device_name(), "sim:h200");
  EXPECT_EQ((*fp8)->kv_dtype(), kvcache::KvDtype::kBF16);
  EXPECT_EQ((*fp8)->bytes_per_block(), 327680 * 16);
  // (141e9 - 70,553,706,496 - 14.1e9) / 5,242,880 = 10,747.2
  EXPECT_EQ((*fp8)->num_blocks(), 10747);

  absl::StatusOr<std::unique_ptr<ModelBackend>> tp2 =
      Llama70b("sim:h200x2", 2.0, &model);
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  EXPECT_EQ((*tp2)->device_name(), "sim:h200x2");
  // Each rank: 70.55 GB of bf16 weights; the same KV bytes, half a token.
  EXPECT_EQ((*tp2)->bytes_per_block(), 163840 * 16);
  EXPECT_EQ((*tp2)->num_blocks(), 21494);

  absl::StatusOr<std::unique_ptr<ModelBackend>> none =
      Llama70b("sim:h200", 2.0, &model);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("sim:h200x2"));
  EXPECT_THAT(none.status().message(), HasSubstr("--sim-weight-bytes"));
}

TEST(SimBackendTest, RefusesKvDtypesTheGpuDoesNotStore) {
  LoadedModel model = *LoadModel("llama3-70b", Device::kSim);
  BackendConfig c = SimBackendConfig("sim:h200x2", 2.0);
  c.kv_dtype = kvcache::KvDtype::kF16;
  absl::StatusOr<std::unique_ptr<ModelBackend>> b = CreateBackend(c, &model);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("--kv-cache-dtype fp16"));
  c.kv_dtype = kvcache::KvDtype::kFP8;
  b = CreateBackend(c, &model);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->bytes_per_block(), 81920 * 16);
}

// Two sequences: a 5-token prefill (KV 0-4) and a decode at position 9.
models::ForwardBatch TwoSequences() {
  models::ForwardBatch b;
  b.token_ids = {11, 12, 13, 14, 15, 900};
  b.positions = {0, 1, 2, 3, 4, 9};
  b.slot_mapping = {0, 1, 2, 3, 4, 16 + 9};
  b.seq_starts = {0, 5, 6};
  b.context_lens = {5, 10};
  b.max_blocks_per_seq = 1;
  b.block_tables = {0, 1};
  b.logits_rows = {4, 5};
  return b;
}

models::ForwardBatch Only(const models::ForwardBatch& b, int s) {
  models::ForwardBatch o;
  const int begin = b.seq_starts[s], end = b.seq_starts[s + 1];
  o.token_ids.assign(b.token_ids.begin() + begin, b.token_ids.begin() + end);
  o.positions.assign(b.positions.begin() + begin, b.positions.begin() + end);
  o.slot_mapping.assign(b.slot_mapping.begin() + begin,
                        b.slot_mapping.begin() + end);
  o.seq_starts = {0, end - begin};
  o.context_lens = {b.context_lens[s]};
  o.max_blocks_per_seq = 1;
  o.block_tables = {b.block_tables[s]};
  o.logits_rows = {end - begin - 1};
  return o;
}

TEST(SimBackendTest, TokensAreSeededBatchInvariantAndNeverSpecial) {
  LoadedModel model;
  auto backend = Llama70b("sim:h200", 1.0, &model);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const models::ForwardBatch both = TwoSequences();
  models::ForwardOutput out;
  ASSERT_TRUE((*backend)->Forward(both, &out).ok());
  ASSERT_EQ(out.argmax.size(), 2u);
  const std::vector<int32_t> together = out.argmax;
  // Rows a sampler reads carry the same token as their largest logit.
  const int64_t vocab = model.config.vocab_size;
  ASSERT_EQ(out.logits.size(), static_cast<size_t>(2 * vocab));
  for (int k = 0; k < 2; ++k) {
    const float* row = out.logits.data() + k * vocab;
    EXPECT_EQ(std::max_element(row, row + vocab) - row, together[k]);
  }
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE((*backend)->Forward(Only(both, s), &out).ok());
    EXPECT_EQ(out.argmax[0], together[s]) << "sequence " << s;
  }
  // Another seed, other tokens.
  BackendConfig c = SimBackendConfig("sim:h200", 1.0);
  c.sim.seed = 1;
  auto other = CreateBackend(c, &model);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->Forward(both, &out).ok());
  EXPECT_NE(out.argmax, together);
  // Over many rows: spread over the vocab, never EOS or a control id.
  models::ForwardBatch many;
  std::set<int32_t> seen;
  for (int32_t i = 0; i < 2000; ++i) {
    many.token_ids.push_back(i);
    many.positions.push_back(i);
    many.slot_mapping.push_back(i);
    many.logits_rows.push_back(i);
    many.argmax_only.push_back(1);
  }
  many.seq_starts = {0, 2000};
  many.context_lens = {2000};
  many.max_blocks_per_seq = 125;
  for (int32_t i = 0; i < 125; ++i) many.block_tables.push_back(i);
  ASSERT_TRUE((*backend)->Forward(many, &out).ok());
  EXPECT_TRUE(out.logits.empty());  // argmax-only rows: no logits at all
  for (int32_t id : out.argmax) {
    ASSERT_GE(id, 0);
    ASSERT_LT(id, vocab);
    EXPECT_FALSE(model.tokenizer->IsEog(id) || model.tokenizer->IsSpecial(id));
    seen.insert(id);
  }
  EXPECT_GT(seen.size(), 1900u);
}

TEST(SimBackendTest, AStepLastsAtLeastItsRooflineTime) {
  LoadedModel model = *LoadModel("llama3-70b", Device::kSim);
  BackendConfig c = SimBackendConfig("sim:h200", 1.0);
  c.sim.speed = 1;
  auto backend = CreateBackend(c, &model);
  ASSERT_TRUE(backend.ok()) << backend.status();
  const models::ForwardBatch b = TwoSequences();
  const models::sim::Roofline roofline(model.config,
                                       *models::sim::FindGpu("h200"), 1, 1.0,
                                       (*backend)->bytes_per_block() / 16);
  // 6 tokens; 5 x 6 / 2 + 10 keys attended; K/V of 9 cached tokens read.
  const double expected =
      roofline.Step({.tokens = 6, .attended = 25, .kv_read_tokens = 9}).total_s;
  EXPECT_GT(expected, 0.015);  // the weights alone: 70.5 GB at 3.84 TB/s
  models::ForwardOutput out;
  const absl::Time t0 = absl::Now();
  ASSERT_TRUE((*backend)->Forward(b, &out).ok());
  EXPECT_GE(absl::ToDoubleSeconds(absl::Now() - t0), expected);
}

TEST(SimBackendTest, PresetWithoutFilesGetsTheSyntheticTokenizer) {
  absl::StatusOr<LoadedModel> m = LoadModel("llama3-70b", Device::kSim);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->path, "preset:llama3-70b");
  EXPECT_EQ(m->tokenizer->vocab_size(), 128256);
  const std::vector<int32_t> ids = m->tokenizer->Encode("Hi!", true, false);
  EXPECT_EQ(ids,
            (std::vector<int32_t>{models::kSyntheticBosId, 'H', 'i', '!'}));
  EXPECT_EQ(m->tokenizer->Decode({'H', 'i', 300}, true), "Hi t300");
  EXPECT_FALSE(LoadModel("no-such-model", Device::kSim).ok());
}

// What a finished request reports, collected from its stream.
struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  Usage usage;
};

struct TraceRun {
  std::vector<Outcome> outcomes;
  int64_t steps = 0;
};

// Submits every spec to a paused engine, starts it and waits for all.
TraceRun RunTrace(Engine& engine, const std::vector<RequestSpec>& specs) {
  TraceRun run;
  run.outcomes.resize(specs.size());
  absl::Mutex mu;
  std::atomic<int> done{0};
  std::vector<std::shared_ptr<StreamState>> streams;
  for (size_t i = 0; i < specs.size(); ++i) {
    absl::StatusOr<std::shared_ptr<StreamState>> st = engine.Submit(specs[i]);
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return run;
    Outcome* o = &run.outcomes[i];
    StreamState* raw = st->get();
    raw->Attach([&mu, &done, o, raw](const StreamDelta& d) {
      {
        absl::MutexLock lock(&mu);
        o->tokens.insert(o->tokens.end(), d.token_ids.begin(),
                         d.token_ids.end());
        if (d.finished) {
          o->finish = d.finish_reason;
          o->usage = d.usage;
        }
      }
      if (d.finished) done.fetch_add(1);
      raw->Ack();
    });
    streams.push_back(*std::move(st));
  }
  engine.Start();
  const absl::Time deadline = absl::Now() + absl::Seconds(300);
  while (done.load() < static_cast<int>(specs.size()) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  run.steps = engine.Stats().steps;
  absl::MutexLock lock(&mu);
  return run;
}

// Eight greedy requests, ignore_eos, sharing a 32-token prefix, in a pool
// of 12 blocks of 16 that cannot hold them all: admission waits,
// preemptions by recompute and prefix-cache hits.
std::vector<RequestSpec> Trace() {
  std::vector<RequestSpec> specs;
  for (int r = 0; r < 8; ++r) {
    RequestSpec s;
    for (int t = 0; t < 32; ++t) s.prompt_tokens.push_back(300 + t);
    for (int t = 0; t < 8 + r; ++t)
      s.prompt_tokens.push_back(1000 + r * 50 + t);
    s.max_tokens = 24 + 3 * r;
    s.sampling.temperature = 0;
    s.ignore_eos = true;
    specs.push_back(std::move(s));
  }
  return specs;
}

EngineConfig TraceConfig(Device device) {
  EngineConfig c;
  c.device = device;
  c.scheduler.block_size = 16;
  c.scheduler.max_num_seqs = 6;
  c.scheduler.max_num_batched_tokens = 64;
  c.scheduler.preemption_mode = scheduler::PreemptionMode::kRecompute;
  // SmolLM2: 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes (CPU fp16,
  // sim bf16) = 23,040 bytes a token.
  c.kv_cache_dtype =
      device == Device::kCpu ? kvcache::KvDtype::kF16 : kvcache::KvDtype::kBF16;
  c.kv_cache_bytes = int64_t{12} * 16 * 23040;
  c.swap_space_bytes = 0;
  c.sim.speed = 0;
  return c;
}

TEST(SimBackendTest, SchedulesATraceExactlyAsTheCpuEngineDoes) {
  absl::StatusOr<LoadedModel> cpu_model = LoadModel(kModel, Device::kCpu);
  ASSERT_TRUE(cpu_model.ok()) << cpu_model.status();
  absl::StatusOr<LoadedModel> sim_model = LoadModel(kModel, Device::kSim);
  ASSERT_TRUE(sim_model.ok()) << sim_model.status();
  EngineOptions paused;
  paused.start_paused = true;
  auto cpu = Engine::Create(TraceConfig(Device::kCpu), *std::move(cpu_model),
                            std::move(paused), nullptr);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EngineOptions paused_sim;
  paused_sim.start_paused = true;
  auto sim = Engine::Create(TraceConfig(Device::kSim), *std::move(sim_model),
                            std::move(paused_sim), nullptr);
  ASSERT_TRUE(sim.ok()) << sim.status();
  ASSERT_EQ((*cpu)->model_info().num_blocks, 12);
  ASSERT_EQ((*sim)->model_info().num_blocks, 12);
  EXPECT_TRUE((*sim)->model_info().simulated);
  EXPECT_FALSE((*cpu)->model_info().simulated);

  const TraceRun a = RunTrace(**cpu, Trace());
  const TraceRun b = RunTrace(**sim, Trace());
  EXPECT_EQ(a.steps, b.steps);
  int64_t preemptions = 0, cached = 0;
  for (size_t i = 0; i < a.outcomes.size(); ++i) {
    const Outcome& x = a.outcomes[i];
    const Outcome& y = b.outcomes[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(x.finish, FinishReason::kLength);
    EXPECT_EQ(y.finish, FinishReason::kLength);
    EXPECT_EQ(x.tokens.size(), y.tokens.size());
    EXPECT_EQ(x.usage.completion_tokens, y.usage.completion_tokens);
    EXPECT_EQ(x.usage.cached_prompt_tokens, y.usage.cached_prompt_tokens);
    EXPECT_EQ(x.usage.kv.peak_blocks, y.usage.kv.peak_blocks);
    EXPECT_EQ(x.usage.kv.preemptions_recompute,
              y.usage.kv.preemptions_recompute);
    EXPECT_EQ(x.usage.kv.recomputed_tokens, y.usage.kv.recomputed_tokens);
    preemptions += x.usage.kv.preemptions_recompute;
    cached += x.usage.cached_prompt_tokens;
  }
  // The trace exercises what it is meant to.
  EXPECT_GT(preemptions, 0);
  EXPECT_GT(cached, 0);
}

}  // namespace
}  // namespace kvserve::engine
