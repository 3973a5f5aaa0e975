// The report and the command line of `kvserve sim-replay` (sim_replay.h).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_format.h"
#include "cli/kv_dtype_flag.h"
#include "cli/sim_replay.h"
#include "common/cli_args.h"
#include "common/status_macros.h"
#include "engine/runner/loaded_model.h"
#include "nlohmann/json.hpp"
#include "scheduler/scheduler_config.h"

namespace kvserve::cli {
namespace {

struct Stat {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};

Stat StatOf(std::vector<double> v) {
  Stat s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) {
    return v[std::min(v.size() - 1,
                      static_cast<size_t>(std::ceil(q * v.size())) - 1)];
  };
  s.p50 = at(0.5);
  s.p90 = at(0.9);
  s.p99 = at(0.99);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  return s;
}

struct Summary {
  int64_t completed = 0, failed = 0, input = 0, output = 0, cached = 0;
  int64_t preemptions = 0, peak_blocks = 0, blocks_total = 0;
  Stat ttft, tpot, e2e;
};

Summary Summarize(const ReplayResult& r) {
  Summary s;
  std::vector<double> ttft, tpot, e2e;
  for (const ReplayedRequest& q : r.requests) {
    if (!q.ok) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.input += q.prompt_tokens;
    s.output += q.output_tokens;
    s.cached += q.cached_tokens;
    s.preemptions += q.preemptions;
    ttft.push_back(q.ttft);
    e2e.push_back(q.e2e);
    if (q.output_tokens > 1) {
      tpot.push_back((q.e2e - q.ttft) / (q.output_tokens - 1));
    }
  }
  for (const ReplaySample& x : r.samples) {
    s.peak_blocks = std::max<int64_t>(s.peak_blocks, x.blocks_active);
    s.blocks_total = x.blocks_total;
  }
  s.ttft = StatOf(std::move(ttft));
  s.tpot = StatOf(std::move(tpot));
  s.e2e = StatOf(std::move(e2e));
  return s;
}

}  // namespace

std::string FormatReplaySummary(const ReplayResult& r,
                                const std::string& title) {
  const Summary s = Summarize(r);
  const double t = std::max(r.virtual_seconds, 1e-9);
  std::string out = absl::StrFormat("%s\n", title);
  const auto line = [&](const char* k, const std::string& v) {
    absl::StrAppendFormat(&out, "%-34s%16s\n", k, v);
  };
  line("Successful requests:", absl::StrCat(s.completed));
  line("Failed requests:", absl::StrCat(s.failed));
  line("Duration (s):", absl::StrFormat("%.2f", r.virtual_seconds));
  line("Total input tokens:", absl::StrCat(s.input));
  line("Total generated tokens:", absl::StrCat(s.output));
  line("Request throughput (req/s):", absl::StrFormat("%.2f", s.completed / t));
  line("Output token throughput (tok/s):",
       absl::StrFormat("%.1f", s.output / t));
  line("Total token throughput (tok/s):",
       absl::StrFormat("%.1f", (s.input + s.output) / t));
  line("Prefix cache hits (tokens):",
       absl::StrFormat("%d (%.1f%%)", s.cached,
                       100.0 * s.cached / std::max<int64_t>(s.input, 1)));
  line("Preemptions:", absl::StrCat(s.preemptions));
  line("Peak KV blocks in use:",
       absl::StrFormat("%d of %d", s.peak_blocks, s.blocks_total));
  line("Engine steps:", absl::StrCat(r.steps));
  line("Replay wall time (s):", absl::StrFormat("%.2f", r.wall_seconds));
  line("Replay speed (x real time):",
       absl::StrFormat("%.0f",
                       r.virtual_seconds / std::max(r.wall_seconds, 1e-9)));
  absl::StrAppendFormat(&out, "%-10s%12s%12s%12s%12s\n", "(ms)", "p50", "p90",
                        "p99", "mean");
  for (const auto& [name, st] :
       {std::pair{"TTFT", s.ttft}, std::pair{"TPOT", s.tpot},
        std::pair{"E2E", s.e2e}}) {
    absl::StrAppendFormat(&out, "%-10s%12.2f%12.2f%12.2f%12.2f\n", name,
                          st.p50 * 1e3, st.p90 * 1e3, st.p99 * 1e3,
                          st.mean * 1e3);
  }
  return out;
}

std::string FormatReplayJson(const ReplayResult& r) {
  const Summary s = Summarize(r);
  const double t = std::max(r.virtual_seconds, 1e-9);
  const auto stat = [](const Stat& x) {
    return nlohmann::ordered_json{
        {"p50", x.p50}, {"p90", x.p90}, {"p99", x.p99}, {"mean", x.mean}};
  };
  nlohmann::ordered_json j{
      {"completed", s.completed},
      {"failed", s.failed},
      {"virtual_seconds", r.virtual_seconds},
      {"wall_seconds", r.wall_seconds},
      {"speedup", r.virtual_seconds / std::max(r.wall_seconds, 1e-9)},
      {"steps", r.steps},
      {"input_tokens", s.input},
      {"output_tokens", s.output},
      {"request_throughput", s.completed / t},
      {"output_throughput", s.output / t},
      {"total_token_throughput", (s.input + s.output) / t},
      {"cached_prompt_tokens", s.cached},
      {"preemptions", s.preemptions},
      {"peak_kv_blocks", s.peak_blocks},
      {"kv_blocks", s.blocks_total}};
  j["ttft_seconds"] = stat(s.ttft);
  j["tpot_seconds"] = stat(s.tpot);
  j["e2e_seconds"] = stat(s.e2e);
  return j.dump() + "\n";
}

std::string FormatReplayTimeseries(const ReplayResult& r) {
  std::string out =
      "time_s,running,waiting,blocks_active,blocks_cached,blocks_total,"
      "finished,preemptions,cached_tokens,step_seconds,tokens,seqs,attended,"
      "kv_read_tokens\n";
  for (size_t i = 0; i < r.samples.size(); ++i) {
    const ReplaySample& x = r.samples[i];
    const engine::StepRecord& s = r.step_log[i];
    absl::StrAppendFormat(
        &out, "%.6f,%d,%d,%d,%d,%d,%d,%d,%d,%.6g,%d,%d,%d,%d\n", x.time,
        x.running, x.waiting, x.blocks_active, x.blocks_cached, x.blocks_total,
        x.finished, x.preemptions, x.cached_tokens, s.seconds, s.load.tokens,
        s.load.seqs, s.load.attended, s.load.kv_read_tokens);
  }
  return out;
}

}  // namespace kvserve::cli
