// Scheduler step cost: Schedule() + UpdateFromOutput() with no model, so the
// figure is pure CPU bookkeeping per engine step (target: <= 50 us with 256
// running decode sequences on a 64K-block pool).
//
//   BM_DecodeStep/256      256 sequences in steady decode (mid-length tables)
//   BM_ChurnStep/256       decode plus arrivals and finishes every few steps
//   BM_WrittenSlots/256    KvCacheManager::WrittenSlots over those tables
//                          (the engine: at most every 50 ms while busy)
//   BM_BuildKvState/N      engine::BuildKvState of an N-block pool, 256
//                          sequences running (at most every 200 ms while
//                          /v1/kv/state is polled)
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/check.h"
#include "engine/kv_state.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {
namespace {

constexpr int32_t kBlocks = 64 * 1024;
constexpr int32_t kPromptLen = 512;

SchedulerConfig BenchConfig(int32_t num_seqs) {
  SchedulerConfig c;
  c.max_num_seqs = num_seqs;
  c.max_num_batched_tokens = 8192;
  c.block_size = 16;
  c.num_blocks = kBlocks;
  c.watermark = 0.01;
  c.max_model_len = 8192;
  c.max_queued_requests = 1 << 20;
  return c;
}

void AddRequest(Scheduler& sched, RequestId id, int32_t prompt_len,
                int32_t max_tokens) {
  std::vector<int32_t> prompt(prompt_len);
  for (int32_t i = 0; i < prompt_len; ++i) prompt[i] = i % 32000;
  const absl::Status s = sched.AddRequest(
      std::make_unique<Request>(id, std::move(prompt), max_tokens));
  KV_CHECK(s.ok(), "AddRequest: ", s.ToString());
}

// One engine step with a fake sampler; returns the number finished.
size_t Step(Scheduler& sched, std::vector<int32_t>& sampled) {
  const SchedulerOutput out = sched.Schedule();
  sampled.assign(out.num_producing(), 7);
  return sched.UpdateFromOutput(out, sampled).size();
}

// 256 sequences with prompt 512 and room for `kDecodeSteps` decode steps
// (about 220 blocks each at the end: 56K of the 64K blocks). Prefill runs
// untimed; the scheduler is rebuilt (untimed) before it runs dry.
void BM_DecodeStep(benchmark::State& state) {
  const auto num_seqs = static_cast<int32_t>(state.range(0));
  constexpr int32_t kDecodeSteps = 3000;
  std::unique_ptr<Scheduler> sched;
  std::vector<int32_t> sampled;
  int32_t steps_left = 0;
  for (auto _ : state) {
    if (steps_left == 0) {
      state.PauseTiming();
      sched = std::make_unique<Scheduler>(BenchConfig(num_seqs));
      for (RequestId id = 0; id < num_seqs; ++id) {
        AddRequest(*sched, id, kPromptLen, kDecodeSteps + 1);
      }
      while (sched->num_waiting() > 0 ||
             sched->GetRequest(num_seqs - 1)->num_output_tokens() == 0) {
        Step(*sched, sampled);
      }
      steps_left = kDecodeSteps - 1;
      state.ResumeTiming();
    }
    benchmark::DoNotOptimize(Step(*sched, sampled));
    --steps_left;
  }
  KV_CHECK(sched->stats().num_preemptions_total == 0, "bench preempted");
  state.counters["seqs"] = num_seqs;
  state.counters["kv_usage"] = sched->kv_usage().usage;
}
BENCHMARK(BM_DecodeStep)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

// Requests of 128 prompt + 128 output tokens arrive to keep `num_seqs`
// running: most steps are decode, some carry new prompts.
void BM_ChurnStep(benchmark::State& state) {
  const auto num_seqs = static_cast<int32_t>(state.range(0));
  Scheduler sched(BenchConfig(num_seqs));
  std::vector<int32_t> sampled;
  RequestId next_id = 0;
  int64_t finished = 0;
  for (auto _ : state) {
    while (sched.num_running() + sched.num_waiting() < num_seqs) {
      AddRequest(sched, next_id, 128, 64 + next_id % 128);
      ++next_id;
    }
    finished += static_cast<int64_t>(Step(sched, sampled));
  }
  state.counters["finished_per_step"] =
      static_cast<double>(finished) / state.iterations();
}
BENCHMARK(BM_ChurnStep)->Arg(256)->Unit(benchmark::kMicrosecond);

// `num_seqs` sequences of 512 prompt + 1,500 decoded tokens (126 blocks
// each), all running.
void BM_WrittenSlots(benchmark::State& state) {
  const auto num_seqs = static_cast<int32_t>(state.range(0));
  Scheduler sched(BenchConfig(num_seqs));
  std::vector<int32_t> sampled;
  for (RequestId id = 0; id < num_seqs; ++id) {
    AddRequest(sched, id, kPromptLen, 4000);
  }
  while (sched.GetRequest(num_seqs - 1)->num_output_tokens() < 1500) {
    Step(sched, sampled);
  }
  const auto computed = [&sched](RequestId id) {
    return sched.GetRequest(id)->num_computed_tokens();
  };
  int64_t written = 0;
  for (auto _ : state) {
    written = sched.kv_cache().WrittenSlots(computed);
    benchmark::DoNotOptimize(written);
  }
  state.counters["blocks"] = sched.kv_usage().active_blocks;
  state.counters["written"] = static_cast<double>(written);
}
BENCHMARK(BM_WrittenSlots)->Arg(256)->Unit(benchmark::kMicrosecond);

void BM_BuildKvState(benchmark::State& state) {
  SchedulerConfig c = BenchConfig(256);
  c.num_blocks = static_cast<int32_t>(state.range(0));
  Scheduler sched(c);
  std::vector<int32_t> sampled;
  for (RequestId id = 0; id < 256; ++id) AddRequest(sched, id, kPromptLen, 64);
  while (sched.num_waiting() > 0) Step(sched, sampled);
  size_t bytes = 0;
  for (auto _ : state) {
    const engine::KvState st =
        engine::BuildKvState(sched, kvcache::KvDtype::kF16, 1, 0);
    bytes = st.cell_active.size();
    benchmark::DoNotOptimize(bytes);
  }
  state.counters["cells"] = static_cast<double>(bytes);
}
BENCHMARK(BM_BuildKvState)
    ->Arg(64 * 1024)
    ->Arg(1024 * 1024)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvserve::scheduler

BENCHMARK_MAIN();
