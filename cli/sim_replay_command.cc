// The flags of `kvserve sim-replay` (cli/sim_replay.h).
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "cli/kv_dtype_flag.h"
#include "cli/logging.h"
#include "cli/sim_profile.h"
#include "cli/sim_replay.h"
#include "common/cli_args.h"
#include "common/status_macros.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/platform.h"
#include "models/sim/roofline.h"
#include "scheduler/scheduler_config.h"

namespace kvserve::cli {
namespace {

struct ReplayFlags {
  std::string model = "llama3-70b";
  std::string device = "sim:h200x2";
  std::string trace;
  SyntheticTraceSpec synth;
  int64_t num_requests = 1000, input_len = 512, output_len = 128;
  int64_t num_prefixes = 0, prefix_len = 0, seed = 0;
  std::string kv_cache_dtype = "auto";
  std::string preemption_mode{scheduler::PreemptionModeName(
      scheduler::SchedulerConfig{}.preemption_mode)};
  int64_t block_size = scheduler::SchedulerConfig{}.block_size;
  int64_t max_num_seqs = 256, max_num_batched_tokens = 8192;
  int64_t swap_space_bytes = int64_t{4} << 30;
  int64_t kv_cache_bytes = 0;
  double gpu_memory_fraction = engine::kDefaultGpuMemoryFraction;
  std::string kv_reservation{scheduler::KvReservationName(
      scheduler::SchedulerConfig{}.kv_reservation)};
  bool prefix_caching = true;
  engine::SimConfig sim;
  bool json = false;
  std::string timeseries;
  std::string log_level = "warn";
  std::string profile_out, sim_profile;
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

void RegisterEngineFlags(ReplayFlags* f, CliArgs* a) {
  a->String("model", &f->model, "preset or path (default llama3-70b)");
  a->String("device", &f->device,
            "sim:<gpu>[x<tp>] (h100, h200, a100, l40s) replays in virtual "
            "time; cpu or cuda runs the trace for real, in real time "
            "(default sim:h200x2)");
  a->String("kv-cache-dtype", &f->kv_cache_dtype, "bf16, fp8, int8 (auto)");
  a->String("preemption-mode", &f->preemption_mode, "auto, recompute or swap");
  a->Int("block-size", &f->block_size, "tokens per KV block (16)", 1, 1024);
  a->Int("max-num-seqs", &f->max_num_seqs, "running sequences (256)", 1,
         1 << 16);
  a->Int("max-num-batched-tokens", &f->max_num_batched_tokens,
         "tokens per step (8192)", 1, 1 << 22);
  a->Bytes("kv-cache-bytes", &f->kv_cache_bytes,
           "KV pool bytes (default: the device's own rule; give the same "
           "value to compare a real run with its simulation)");
  a->Bytes("swap-space-bytes", &f->swap_space_bytes,
           "host swap space for preemption by swap (4GiB)");
  a->Bool("prefix-caching", &f->prefix_caching, "prefix cache (on)");
  a->Float("gpu-memory-fraction", &f->gpu_memory_fraction,
           "share of GPU memory for weights and KV (0.9)", 0.01, 1);
  a->String("kv-reservation", &f->kv_reservation,
            "paged (admit by the prompt, preempt when KV runs out) or "
            "max-length (reserve prompt + max_tokens: never preempts)");
  a->Float("sim-weight-bytes", &f->sim.weight_bytes,
           "bytes per weight parameter (0 = the model's dtype)", 0, 8);
  a->Float("sim-memory-efficiency", &f->sim.memory_efficiency,
           absl::StrCat("share of the memory bandwidth a step reaches (",
                        models::sim::Efficiency{}.memory, ")"),
           0.01, 1);
  a->Float("sim-flops-efficiency", &f->sim.flops_efficiency,
           absl::StrCat("share of the dense matrix rate a step reaches (",
                        models::sim::Efficiency{}.flops, ")"),
           0.01, 1);
  a->Float("sim-host-us-per-seq", &f->sim.host_us_per_seq,
           absl::StrCat("the host's microseconds per sequence of a step (",
                        models::sim::Efficiency{}.host_s_per_seq * 1e6, ")"),
           0, 1000);
  a->Bool("json", &f->json, "print one JSON object instead of the table");
  a->String("timeseries", &f->timeseries,
            "write KV occupancy, queues, preemptions and prefix hits per step "
            "to this CSV (tools/plot_sim_replay.py draws it)");
  a->String("profile-out", &f->profile_out,
            "after a run on a real device (--device cpu): fit a step profile "
            "to its steps and write it here (JSON)");
  a->String("sim-profile", &f->sim_profile,
            "a step profile (--profile-out) to run the simulated device on "
            "instead of the roofline");
  a->String("log-level", &f->log_level,
            "stderr log level: trace, debug, info, warn (default), error, off");
  a->Bool("help", &f->help, "show this help");
}

absl::StatusOr<engine::EngineConfig> EngineConfigOf(const ReplayFlags& f) {
  engine::EngineConfig e;
  KV_RETURN_IF_ERROR(ApplyDeviceFlags(f.device, f.sim, f.sim_profile, &e));
  if (!f.profile_out.empty() && engine::PlatformFor(e.device).simulated()) {
    return absl::InvalidArgumentError(
        "--profile-out: profiles are measured on a real device (--device "
        "cpu or cuda)");
  }
  KV_ASSIGN_OR_RETURN(e.kv_cache_dtype,
                      ParseKvCacheDtypeFlag(f.kv_cache_dtype));
  KV_ASSIGN_OR_RETURN(e.scheduler.preemption_mode,
                      scheduler::ParsePreemptionMode(f.preemption_mode));
  e.scheduler.block_size = static_cast<int32_t>(f.block_size);
  e.scheduler.max_num_seqs = static_cast<int32_t>(f.max_num_seqs);
  e.scheduler.max_num_batched_tokens =
      static_cast<int32_t>(f.max_num_batched_tokens);
  e.scheduler.enable_prefix_caching = f.prefix_caching;
  KV_ASSIGN_OR_RETURN(e.scheduler.kv_reservation,
                      scheduler::ParseKvReservation(f.kv_reservation));
  e.swap_space_bytes = f.swap_space_bytes;
  e.kv_cache_bytes = f.kv_cache_bytes;
  e.gpu_memory_fraction = f.gpu_memory_fraction;
  return e;
}

absl::Status Replay(ReplayFlags& f) {
  KV_ASSIGN_OR_RETURN(engine::EngineConfig config, EngineConfigOf(f));
  KV_ASSIGN_OR_RETURN(engine::LoadedModel model,
                      engine::LoadModel(f.model, config.device));
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
    KV_RETURN_IF_ERROR(
        WriteStepProfile(f.profile_out, f.device, f.model, r.step_log));
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
      f.json ? FormatReplayJson(r)
             : FormatReplaySummary(
                   r, absl::StrCat("sim-replay: ", f.model, " on ", f.device,
                                   ", ", trace.size(), " requests"));
  std::fputs(text.c_str(), stdout);
  return absl::OkStatus();
}

}  // namespace

int RunSimReplayCommand(int argc, const char* const* argv) {
  ReplayFlags f;
  CliArgs args("sim-replay");
  RegisterEngineFlags(&f, &args);
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
