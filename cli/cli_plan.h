// `kvserve plan`: KV-cache capacity planning from a model's architecture
// numbers. It owns the subcommand's flags (parsed by CliArgs), the
// memory-budget arithmetic (device HBM minus weights minus an activation
// reserve) and the text/JSON report. All KV arithmetic is
// kvcache::ComputeKvPlan; architecture numbers come from a preset (no weights
// needed) or, for a file or HF directory, from a ConfigLoader that the caller
// supplies. It never allocates device memory.
//
//   kvserve plan --model NAME|PATH [--kv-dtype bf16|fp16|fp8|int8|f32]
//       [--context N] [--concurrency N] [--memory BYTES | --gpu NAME]
//       [--tp N] [--block-size 16] [--mean-len N] [--weight-bytes X]
//       [--host-cache-bytes B] [--disk-cache-bytes B] [--remote-cache-bytes B]
//       [--disk-read-gbps X] [--remote-gbps X] [--prefill-tokens-per-second X]
//       [--json]
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kvcache/kv_sizing.h"
#include "models/model_config.h"
#include "models/sim/memory_budget.h"
#include "models/sim/roofline.h"

namespace kvserve::cli {

// What a model file tells the plan: its architecture numbers and the bytes of
// its tensors by type name ("Q4_K", "F32", ...; empty when not read).
struct PlanModel {
  models::ModelConfig config;
  std::map<std::string, int64_t> weight_bytes_by_type;
};

// Reads a PlanModel from a resolved path (a .gguf file or an HF directory).
using ConfigLoader =
    std::function<absl::StatusOr<PlanModel>(const std::string& path)>;

// Share of device HBM kept back for activations, CUDA context and allocator
// slack when --gpu derives the KV budget (models/sim/memory_budget.h).
inline constexpr double kActivationReserveFraction =
    models::sim::kDefaultReserveFraction;

struct PlanFlags {
  std::string model;  // --model: preset name, HF repo id, or path
  kvcache::KvDtype kv_dtype = kvcache::KvDtype::kBF16;
  int64_t context = 0;      // --context; 0 = min(8192, model max_position)
  int64_t concurrency = 0;  // --concurrency; 0 = not asked
  int64_t memory = 0;       // --memory: KV bytes per rank; 0 = not given
  std::string gpu;          // --gpu: models/sim/gpu_specs.h; empty = none
  int tp = 1;               // --tp: tensor-parallel ranks
  int block_size = 16;      // --block-size: tokens per KV block
  int64_t mean_len = 0;     // --mean-len: mean sequence length; 0 = skip
  double weight_bytes = 0;  // --weight-bytes per parameter; 0 = config's
  // --memory-efficiency, --flops-efficiency: the roofline's fractions of the
  // GPU's datasheet rates; --host-us-per-seq: the host's time per sequence of
  // a step (models/sim/roofline.h).
  double memory_efficiency = models::sim::Efficiency{}.memory;
  double flops_efficiency = models::sim::Efficiency{}.flops;
  double host_us_per_seq = models::sim::Efficiency{}.host_s_per_seq * 1e6;
  // The KV tiers below the pool (cli/plan_tiers.h): their sizes, and the
  // rates that predict a load's time against recomputing.
  int64_t host_cache_bytes = 0;          // --host-cache-bytes
  int64_t disk_cache_bytes = 0;          // --disk-cache-bytes
  int64_t remote_cache_bytes = 0;        // --remote-cache-bytes
  double disk_read_gbps = 2.0;           // --disk-read-gbps
  double remote_gbps = 1.25;             // --remote-gbps (10 GbE)
  double prefill_tokens_per_second = 0;  // --prefill-tokens-per-second
  bool json = false;                     // --json
  bool help = false;                     // --help / -h
};

// Parses the flags after "plan" ("--flag value" or "--flag=value", `-h`)
// with CliArgs (common/cli_args.h). InvalidArgument naming the flag for
// unknown flags, missing or bad values (CliArgs' messages), or --memory
// together with --gpu. Does not require --model (see RunPlan).
[[nodiscard]] absl::StatusOr<PlanFlags> ParsePlanFlags(
    const std::vector<std::string>& args);

// "86000000000", "86GB", "80GiB", "1.5T", "512 MiB". Decimal units K, M, G,
// T (with or without a trailing B) are powers of 1000; Ki, Mi, Gi, Ti (with
// or without B) powers of 1024; case-insensitive. InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

// Device memory of a --gpu name (marketed capacity, decimal GB: h100 = 80 GB,
// h200 = 141 GB; models/sim/gpu_specs.h); NotFound for other names.
[[nodiscard]] absl::StatusOr<int64_t> GpuHbmBytes(std::string_view gpu);

// Everything the report shows.
struct Plan {
  std::string model_label;  // preset name or the path given
  models::ModelConfig config;
  // models::EstimateParameterCount(config); 0 for MLA configs, whose MoE
  // experts it does not count.
  int64_t params = 0;
  PlanFlags flags;  // with context resolved
  enum class Budget { kNone, kMemory, kGpu } budget = Budget::kNone;
  int64_t hbm_bytes = 0;              // --gpu only
  int64_t weight_bytes_per_rank = 0;  // --gpu only
  int64_t reserve_bytes = 0;          // --gpu only
  int64_t budget_bytes = 0;  // KV bytes per rank; 0 if none or none left
  kvcache::KvPlan kv;
  // MLA only (0 otherwise): what the same model would cache per token per
  // rank with full K/V heads at the same dtype and tp. MHA:
  // L x KvHeadsPerRank(H, tp) x (KvRowBytes(qk_nope + qk_rope) +
  // KvRowBytes(v_head_dim)); GQA-8 the same with 8 KV heads (0 unless H > 8).
  int64_t mha_equivalent_bytes_per_token = 0;
  int64_t gqa8_equivalent_bytes_per_token = 0;
  std::vector<std::string> notes;
  // Tensor bytes in the model's file by type; empty for presets.
  std::map<std::string, int64_t> weight_bytes_by_type;
};

// Builds the plan for `config` (already loaded) and `flags`. InvalidArgument
// naming the flag when a value does not fit the model (e.g. --mean-len above
// --context) or the numbers overflow.
[[nodiscard]] absl::StatusOr<Plan> BuildPlan(const std::string& model_label,
                                             const models::ModelConfig& config,
                                             const PlanFlags& flags);

// The human-readable report, one "label  value" line each, ending in '\n'.
[[nodiscard]] std::string FormatPlan(const Plan& plan);
// The same as one JSON object (with a trailing newline).
[[nodiscard]] std::string FormatPlanJson(const Plan& plan);
// Usage text for --help and usage errors: CliArgs::Usage() of the flags
// ParsePlanFlags registers.
[[nodiscard]] std::string PlanUsage();

// The whole subcommand without process I/O: parses `args` (after "plan"),
// looks up the preset or resolves the path (models::ResolveModelPath) and
// calls `loader` (error "loading config from files is not wired yet" if it is
// empty); an HF directory whose config.json is MLA (models::IsMlaHfConfig) is
// read by models::ParseHfSizingConfig instead, weights or not, builds and
// formats the plan. Appends the report to *out and errors to *err. Returns 0 on
// success, 2 for usage errors (bad or unknown flags, values that do not fit the
// model), 1 for other failures (model not found, loader errors).
[[nodiscard]] int RunPlan(const std::vector<std::string>& args,
                          const ConfigLoader& loader, std::string* out,
                          std::string* err);

// main()'s entry, with argv as main() received it: argv[0] the program,
// argv[1] "plan", flags from argv[2] (a missing "plan" is tolerated). Prints
// to stdout/stderr and returns RunPlan's exit code.
[[nodiscard]] int RunPlanCommand(int argc, const char* const* argv,
                                 const ConfigLoader& loader = nullptr);

}  // namespace kvserve::cli
