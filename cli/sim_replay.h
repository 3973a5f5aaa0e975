// `kvserve sim-replay`: a trace replayed through the real engine (scheduler,
// KV manager, prefix cache, preemption) on the simulated device in virtual
// time. The clock moves only by the simulated steps and jumps over idle
// gaps, so hours of traffic replay in seconds and the figures are the ones
// a client would see on the simulated GPU: TTFT, TPOT, end-to-end latency,
// throughput, preemptions and prefix hits, with KV occupancy over time.
//
// Arrivals are submitted at their virtual times: during a step, the clock
// stops at each arrival that falls inside it, so a request's queueing
// starts at its arrival, and it is admitted at the next step as on a live
// server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/sim_trace.h"
#include "engine/engine.h"

namespace kvserve::cli {

struct ReplayedRequest {
  double arrival = 0;  // seconds from the start, as the engine stamped it
  double ttft = 0;     // arrival -> first token
  double e2e = 0;      // arrival -> finish
  int32_t prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  int32_t preemptions = 0;
  bool ok = false;  // finished by length
};

// The engine as the replay saw it after a step.
struct ReplaySample {
  double time = 0;  // virtual seconds
  int32_t running = 0, waiting = 0;
  int32_t blocks_active = 0, blocks_cached = 0, blocks_total = 0;
  int64_t finished = 0, preemptions = 0, cached_tokens = 0;  // cumulative
};

struct ReplayResult {
  std::vector<ReplayedRequest> requests;     // in trace order
  std::vector<ReplaySample> samples;         // one per step
  std::vector<engine::StepRecord> step_log;  // every step as it ran
  std::vector<double> step_starts;           // seconds from the start, per step
  double virtual_seconds = 0;                // first arrival -> last finish
  double wall_seconds = 0;
  int64_t steps = 0;
};

// Replays `trace` on an engine made from `config` and `model`: on the
// simulated device in virtual time (its sim.step_sink is the replay's),
// on a real device in real time (each request submitted at its arrival).
// `seed` seeds the prompts' token ids.
//
// `step_starts` (the simulated device only): a recorded run's timeline, its
// ReplayResult::step_starts. Step k then ends where step k + 1 started in
// the recording, whatever its modelled time, so arrivals fall between the
// same steps as they did: replaying a real run's trace (with its recorded
// arrivals) this way must reproduce its scheduling step for step.
[[nodiscard]] absl::StatusOr<ReplayResult> ReplayTrace(
    engine::EngineConfig config, engine::LoadedModel model,
    const std::vector<TraceRequest>& trace, uint64_t seed,
    const std::vector<double>& step_starts = {});

// The summary `tools/kvserve_bench.py` prints (throughput, TTFT, TPOT, E2E
// percentiles, preemptions, prefix hits, peak KV) and the replay speed.
[[nodiscard]] std::string FormatReplaySummary(const ReplayResult& r,
                                              const std::string& title);
[[nodiscard]] std::string FormatReplayJson(const ReplayResult& r);
// One CSV row per sample, with a header.
[[nodiscard]] std::string FormatReplayTimeseries(const ReplayResult& r);

// main()'s entry for argv[1] == "sim-replay". 0 ok, 1 failure, 2 bad flags.
int RunSimReplayCommand(int argc, const char* const* argv);

}  // namespace kvserve::cli
