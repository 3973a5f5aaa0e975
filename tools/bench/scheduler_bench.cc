// Scheduler step cost: Schedule() + UpdateFromOutput() with no model, so the
// figure is pure CPU bookkeeping per engine step (target: <= 50 us with 256
// running decode sequences on a 64K-block pool).
//
//   BM_DecodeStep/256      256 sequences in steady decode (mid-length tables)
//   BM_ChurnStep/256       decode plus arrivals and finishes every few steps
#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/check.h"
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

}  // namespace
}  // namespace kvserve::scheduler

BENCHMARK_MAIN();
