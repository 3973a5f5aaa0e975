// The flags of `kvserve sim-replay` (cli/sim_replay.h).
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "cli/engine_flags.h"
#include "cli/logging.h"
#include "cli/sim_profile.h"
#include "cli/sim_replay.h"
#include "common/cli_args.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/platform.h"
#include "scheduler/scheduler_config.h"

namespace kvserve::cli {
namespace {

// The engine flags sim-replay takes: all but pacing (a simulated replay
// runs in virtual time).
constexpr uint32_t kReplayEngineFlags =
    kModelFlags | kDeviceFlags | kBatchFlags | kPoolFlags | kSimFlags;

// A replay's defaults: a GPU server's scheduler and swap space.
EngineFlags ReplayEngineDefaults() {
  engine::EngineConfig e;
  e.scheduler.max_num_seqs = 256;
  e.scheduler.max_num_batched_tokens = 8192;
  EngineFlags f = EngineFlagsFrom(e, "llama3-70b", "sim:h200x2");
  f.swap_space_bytes = int64_t{4} << 30;
  return f;
}

struct ReplayFlags {
  EngineFlags engine = ReplayEngineDefaults();
  std::string trace;
  SyntheticTraceSpec synth;
  int64_t num_requests = 1000, input_len = 512, output_len = 128;
  int64_t num_prefixes = 0, prefix_len = 0, seed = 0;
  bool json = false;
  std::string timeseries;
  std::string log_level = "warn";
  std::string profile_out;
  bool help = false;
};

void RegisterTraceFlags(ReplayFlags* f, CliArgs* a) {
  a->String("trace", &f->trace,
            "JSON-lines trace (cli/sim_trace.h: arrival, input_len, "
            "output_len, prefix_id, prefix_len); without it a synthetic one");
  a->Int("num-requests", &f->num_requests, "synthetic: requests (1000)", 1,
         10'000'000);
  a->Float("request-rate", &f->synth.request_rate,
           "synthetic: Poisson arrivals per second (0 = all at once)", 0, 1e9);
  a->Int("input-len", &f->input_len, "synthetic: median prompt tokens (512)", 1,
         1 << 22);
  a->Int("output-len", &f->output_len, "synthetic: median output tokens (128)",
         1, 1 << 22);
  a->Float("input-sigma", &f->synth.input_sigma,
           "synthetic: lognormal sigma of prompt lengths (0 = fixed)", 0, 4);
  a->Float("output-sigma", &f->synth.output_sigma,
           "synthetic: lognormal sigma of output lengths (0 = fixed)", 0, 4);
  a->Int("num-prefixes", &f->num_prefixes,
         "synthetic: shared prefixes, request i uses i mod N (0 = none)", 0,
         1 << 20);
  a->Int("prefix-len", &f->prefix_len, "synthetic: tokens of each prefix", 0,
         1 << 22);
  a->Int("seed", &f->seed, "trace and prompt seed (0)", 0, INT64_MAX);
}

void RegisterReplayFlags(ReplayFlags* f, CliArgs* a) {
  RegisterEngineFlags(&f->engine, kReplayEngineFlags, a);
  a->Bool("json", &f->json, "print one JSON object instead of the table");
  a->String("timeseries", &f->timeseries,
            "write KV occupancy, queues, preemptions and prefix hits per step "
            "to this CSV (tools/plot_sim_replay.py draws it)");
  a->String("profile-out", &f->profile_out,
            "after a run on a real device (--device cpu): fit a step profile "
            "to its steps and write it here (JSON)");
  a->String("log-level", &f->log_level,
            "stderr log level: trace, debug, info, warn (default), error, off");
  a->Bool("help", &f->help, "show this help");
}

absl::StatusOr<engine::EngineConfig> EngineConfigOf(const ReplayFlags& f) {
  engine::EngineConfig e;
  KV_RETURN_IF_ERROR(ApplyEngineFlags(f.engine, kReplayEngineFlags, &e));
  if (!f.profile_out.empty() && engine::PlatformFor(e.device).simulated()) {
    return absl::InvalidArgumentError(
        "--profile-out: profiles are measured on a real device (--device "
        "cpu or cuda)");
  }
  return e;
}

absl::Status Replay(ReplayFlags& f) {
  KV_ASSIGN_OR_RETURN(engine::EngineConfig config, EngineConfigOf(f));
  if (f.engine.threads > 0) {
    SetNumThreads(static_cast<int>(f.engine.threads));
  }
  KV_ASSIGN_OR_RETURN(engine::LoadedModel model,
                      engine::LoadModel(f.engine.model, config.device));
  std::vector<TraceRequest> trace;
  if (!f.trace.empty()) {
    KV_ASSIGN_OR_RETURN(trace, ReadTrace(f.trace));
  } else {
    SyntheticTraceSpec& s = f.synth;
    s.num_requests = f.num_requests;
    s.input_len = static_cast<int32_t>(f.input_len);
    s.output_len = static_cast<int32_t>(f.output_len);
    s.num_prefixes = static_cast<int32_t>(f.num_prefixes);
    s.prefix_len = static_cast<int32_t>(f.prefix_len);
    s.max_len = model.config.max_position;
    s.seed = static_cast<uint64_t>(f.seed);
    trace = SyntheticTrace(s);
  }
  KV_ASSIGN_OR_RETURN(ReplayResult r,
                      ReplayTrace(config, std::move(model), trace,
                                  static_cast<uint64_t>(f.seed)));
  if (!f.profile_out.empty()) {
    KV_RETURN_IF_ERROR(WriteStepProfile(f.profile_out, f.engine.device,
                                        f.engine.model, r.step_log));
  }
  if (!f.timeseries.empty()) {
    std::ofstream out(f.timeseries);
    out << FormatReplayTimeseries(r);
    if (!out) {
      return absl::InvalidArgumentError(
          absl::StrCat("--timeseries ", f.timeseries, ": cannot write"));
    }
  }
  const std::string text =
      f.json
          ? FormatReplayJson(r)
          : FormatReplaySummary(r, absl::StrCat("sim-replay: ", f.engine.model,
                                                " on ", f.engine.device, ", ",
                                                trace.size(), " requests"));
  std::fputs(text.c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace

int RunSimReplayCommand(int argc, const char* const* argv) {
  ReplayFlags f;
  CliArgs args("sim-replay");
  RegisterReplayFlags(&f, &args);
  RegisterTraceFlags(&f, &args);
  absl::Status s = args.Parse(argc, argv, 2);
  if (f.help) {
    std::fputs(args.Usage().c_str(), stdout);
    return 0;
  }
  if (s.ok()) SetUpLogging(f.log_level);
  if (s.ok()) s = Replay(f);
  if (s.ok()) return 0;
  std::fprintf(stderr, "kvserve sim-replay: %s\n",
               std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace kvserve::cli
