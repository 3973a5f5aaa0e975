// kvserve command-line entry point: dispatches subcommands.
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/synchronization/mutex.h"
#include "cli/cli_eval.h"
#include "cli/cli_generate.h"
#include "cli/cli_plan.h"
#include "cli/cli_serve.h"
#include "cli/sim_replay.h"
#include "common/status_macros.h"
#include "models/loader/model_files.h"

namespace {
constexpr char kUsage[] =
    "usage: kvserve <command> [flags]\n"
    "       kvserve --model NAME|PATH [flags]   (same as 'kvserve serve')\n"
    "commands:\n"
    "  serve      the gRPC serving daemon: --model NAME|PATH [--port N] ...\n"
    "  generate   one-shot generation: --model NAME|PATH --prompt TEXT\n"
    "  plan       KV-cache sizing: --model NAME|PATH [--context N] ...\n"
    "  eval       KV-cache quality: perplexity and KL divergence vs f32 KV\n"
    "             per KV dtype: --model NAME|PATH [--kv-cache-dtype LIST]\n"
    "  sim-replay a trace through the engine on a simulated GPU, in virtual\n"
    "             time: --model NAME --device sim:h200x2 [--trace FILE]\n"
    "run 'kvserve <command> --help' for the flags of a command\n";
}  // namespace

int main(int argc, char** argv) {
  // Debian's abseil is built with its lock-order graph on: every Mutex lock
  // records an edge (3% of a busy engine step went to GraphCycles alone).
  // The product turns it off, as an NDEBUG abseil does; the test binaries
  // keep it, so lock-order inversions still fail there.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "serve" || cmd.rfind("--", 0) == 0) {
    return kvserve::cli::RunServeCommand(argc, argv);
  }
  if (cmd == "generate") {
    return kvserve::cli::RunGenerateCommand(argc, argv);
  }
  if (cmd == "sim-replay") {
    return kvserve::cli::RunSimReplayCommand(argc, argv);
  }
  if (cmd == "eval") {
    return kvserve::cli::RunEvalCommand(argc, argv);
  }
  if (cmd == "plan") {
    // Paths (.gguf, HF directories) are sized from their own config; the
    // weights are not read.
    return kvserve::cli::RunPlanCommand(
        argc, argv,
        [](const std::string& path) -> absl::StatusOr<kvserve::cli::PlanModel> {
          kvserve::models::OpenModelFilesOptions options;
          options.check_weights = false;
          KV_ASSIGN_OR_RETURN(kvserve::models::ModelFiles files,
                              kvserve::models::OpenModelFiles(path, options));
          return kvserve::cli::PlanModel{
              .config = files.config,
              .weight_bytes_by_type = files.weights->TensorBytesByType()};
        });
  }
  std::fprintf(stderr, "kvserve: unknown command '%s'\n%s", cmd.c_str(),
               kUsage);
  return 2;
}
