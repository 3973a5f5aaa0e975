#include "cli/cli_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/plan_roofline.h"
#include "cli/plan_tiers.h"
#include "common/cli_args.h"
#include "common/status_macros.h"
#include "common/strings.h"
#include "models/ggml_types.h"
#include "models/loader/hf_config.h"
#include "models/loader/mapped_file.h"
#include "models/loader/model_resolver.h"
#include "models/loader/presets.h"
#include "models/sim/gpu_specs.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {
namespace {

using kvcache::KvDtype;

constexpr int64_t kDefaultContext = 8192;
constexpr int64_t kMaxTokens = int64_t{1} << 30;
constexpr int64_t kMaxBytes = int64_t{1} << 60;
// "1,234,567".
std::string WithCommas(int64_t v) {
  std::string digits = absl::StrCat(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return v < 0 ? "-" + out : out;
}

// Three significant digits in powers of 1000: "2.68 GB", "53.7 GB", "141 GB".
std::string DecimalBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(v) >= 999.5 && unit < 5) {
    v /= 1000.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  // A constant format (clang checks StrFormat formats at compile time).
  const int precision = std::fabs(v) < 9.995 ? 2 : std::fabs(v) < 99.95 ? 1 : 0;
  return absl::StrFormat("%.*f %s", precision, v, kUnits[unit]);
}

// One decimal in powers of 1024: "320.0 KiB".
std::string BinaryBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 4) {
    v /= 1024.0;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

// "70.55B", "134.5M".
std::string ParamCount(int64_t params) {
  if (params >= 1'000'000'000) return absl::StrFormat("%.2fB", params / 1e9);
  return absl::StrFormat("%.1fM", params / 1e6);
}

std::string Percent(double fraction) {
  return absl::StrFormat("%.1f%%", 100.0 * fraction);
}

}  // namespace

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  absl::StatusOr<int64_t> bytes = ParseBytes(AbslView(text));
  if (bytes.ok() && (*bytes < 1 || *bytes > kMaxBytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "not a byte size: '%s' (use e.g. 80GB, 75GiB, 512MiB)", text));
  }
  return bytes;
}

absl::StatusOr<int64_t> GpuHbmBytes(std::string_view gpu) {
  KV_ASSIGN_OR_RETURN(const models::sim::GpuSpec spec,
                      models::sim::FindGpu(gpu));
  return spec.memory_bytes;
}

namespace {

// CliArgs stores integers as int64_t; PlanFlags keeps --tp and --block-size
// as int, copied over once parsing succeeded.
struct PlanArgs {
  PlanFlags flags;
  int64_t tp = PlanFlags{}.tp;
  int64_t block_size = 0;  // not given: the default for the dtype
};

// A fraction in (0, 1] into *out.
void RegisterEfficiency(CliArgs* args, const char* name, double* out,
                        const std::string& help) {
  args->Custom(name, "F", help, "a fraction in (0, 1]",
               [out](const std::string& v) {
                 double x = 0;
                 if (!absl::SimpleAtod(v, &x) || !(x > 0 && x <= 1)) {
                   return false;
                 }
                 *out = x;
                 return true;
               });
}

// Registers every flag of `kvserve plan` on `args`, storing into `a`; the
// order is the order of --help.
void RegisterTierFlags(PlanFlags* f, CliArgs* args) {
  auto bytes = [args](const char* name, int64_t* out, const char* help) {
    args->Custom(name, "BYTES", help, "a byte size such as 64GiB",
                 [out](const std::string& v) {
                   absl::StatusOr<int64_t> b = ParseByteSize(v);
                   if (b.ok()) *out = *b;
                   return b.ok();
                 });
  };
  bytes("host-cache-bytes", &f->host_cache_bytes,
        "KV host tier per rank (pinned host memory, --gpu's link)");
  bytes("disk-cache-bytes", &f->disk_cache_bytes,
        "KV disk tier per rank (--kv-disk-cache-bytes)");
  bytes("remote-cache-bytes", &f->remote_cache_bytes,
        "KV remote tier (the store's maxmemory for this model)");
  args->Float("disk-read-gbps", &f->disk_read_gbps,
              "disk tier read rate, GB/s (default 2)", 0.001, 1000);
  args->Float("remote-gbps", &f->remote_gbps,
              "remote tier rate, GB/s (default 1.25: 10 GbE)", 0.001, 1000);
  args->Float("prefill-tokens-per-second", &f->prefill_tokens_per_second,
              "measured prefill rate, the recompute the tiers are compared "
              "with when there is no --gpu roofline",
              0, 1e9);
}

void RegisterPlanFlags(PlanArgs* a, CliArgs* args) {
  PlanFlags* f = &a->flags;
  args->SetUsageHeader(
      "usage: kvserve plan --model NAME|PATH [flags]\n"
      "KV-cache sizing from a model's architecture (no weights needed for a "
      "preset).\n");
  args->String("model", &f->model,
               absl::StrCat("preset (", models::PresetNames(),
                            "), HF repo id, .gguf file or HF directory "
                            "(DeepSeek-V2/V3 MLA: config.json alone is "
                            "enough)"));
  auto set_dtype = [f](const std::string& v) {
    absl::StatusOr<KvDtype> d = kvcache::ParseKvDtype(v);
    if (d.ok()) f->kv_dtype = *d;
    return d.ok();
  };
  args->Custom("kv-cache-dtype", "D",
               "bf16 (default), fp16, fp8, int8 (q8_0 layout), int4 (q4_0 "
               "layout), int3, int2 (KIVI, CPU), f32 (the name serve and "
               "generate use)",
               "bf16, fp16, fp8, int8, int4, int3, int2 or f32", set_dtype);
  args->Custom("kv-dtype", "D", "alias of --kv-cache-dtype",
               "bf16, fp16, fp8, int8, int4, int3, int2 or f32", set_dtype);
  args->Int("context", &f->context,
            "tokens per sequence; default min(8192, model max)", 1, kMaxTokens);
  args->Int("concurrency", &f->concurrency, "sequences to hold at once", 1,
            kMaxTokens);
  args->Custom("memory", "BYTES", "KV budget per rank, e.g. 80GB, 75GiB",
               "a byte size such as 80GB, 75GiB or 8e10",
               [f](const std::string& v) {
                 absl::StatusOr<int64_t> bytes = ParseByteSize(v);
                 if (bytes.ok()) f->memory = *bytes;
                 return bytes.ok();
               });
  args->Custom("gpu", "NAME",
               absl::StrCat(models::sim::GpuNames(),
                            ": budget = device memory - weights per rank - "
                            "10% activation reserve; adds roofline step "
                            "times"),
               absl::StrCat("one of ", models::sim::GpuNames()),
               [f](const std::string& v) {
                 if (!GpuHbmBytes(v).ok()) return false;
                 f->gpu = absl::AsciiStrToLower(v);
                 return true;
               });
  args->Int("tp", &a->tp, "tensor-parallel ranks (default 1)", 1, 4096);
  args->Int("block-size", &a->block_size,
            "tokens per KV block (default 16; 32 for int3 and int2)", 1, 4096);
  args->Int("mean-len", &f->mean_len,
            "mean sequence length for the idle-KV comparison", 1, kMaxTokens);
  args->Custom("weight-bytes", "X",
               "bytes per weight for --gpu (default: the checkpoint's, 2 for "
               "bf16)",
               "bytes per parameter in (0, 8], e.g. 0.5",
               [f](const std::string& v) {
                 double x = 0;
                 if (!absl::SimpleAtod(v, &x) || !(x > 0 && x <= 8)) {
                   return false;
                 }
                 f->weight_bytes = x;
                 return true;
               });
  RegisterEfficiency(args, "memory-efficiency", &f->memory_efficiency,
                     absl::StrCat("roofline: fraction of the GPU's memory "
                                  "bandwidth a step reaches (default ",
                                  models::sim::Efficiency{}.memory, ")"));
  RegisterEfficiency(args, "flops-efficiency", &f->flops_efficiency,
                     absl::StrCat("roofline: fraction of its dense matrix "
                                  "rate (default ",
                                  models::sim::Efficiency{}.flops, ")"));
  args->Float("host-us-per-seq", &f->host_us_per_seq,
              absl::StrCat("roofline: the host's microseconds per sequence "
                           "of a step (default ",
                           models::sim::Efficiency{}.host_s_per_seq * 1e6, ")"),
              0, 1000);
  RegisterTierFlags(f, args);
  args->Bool("json", &f->json, "print one JSON object");
  args->Bool("help", &f->help, "show this help (also -h)");
}

}  // namespace

absl::StatusOr<PlanFlags> ParsePlanFlags(const std::vector<std::string>& args) {
  PlanArgs a;
  CliArgs cli("plan");
  RegisterPlanFlags(&a, &cli);
  std::vector<const char*> argv;
  argv.reserve(args.size());
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  KV_RETURN_IF_ERROR(cli.Parse(static_cast<int>(argv.size()), argv.data(), 0));
  PlanFlags f = std::move(a.flags);
  f.tp = static_cast<int>(a.tp);
  f.block_size = a.block_size > 0 ? static_cast<int>(a.block_size)
                                  : kvcache::KvDtypeDefaultBlockSize(
                                        f.kv_dtype, PlanFlags{}.block_size);
  KV_RETURN_IF_ERROR(kvcache::CheckKvDtypeBlockSize(f.kv_dtype, f.block_size));
  if (f.memory > 0 && !f.gpu.empty()) {
    return absl::InvalidArgumentError(
        "--memory and --gpu are mutually exclusive: --memory is the KV budget "
        "itself, --gpu derives it from the device's HBM");
  }
  return f;
}

namespace {

// Fills the --gpu budget: HBM - weights per rank - activation reserve
// (models/sim/memory_budget.h, which the simulated device sizes its pool by).
void ApplyGpuBudget(Plan& p) {
  p.budget = Plan::Budget::kGpu;
  const double per_param = p.flags.weight_bytes > 0
                               ? p.flags.weight_bytes
                               : p.config.weight_dtype_bytes;
  const models::sim::MemoryBudget b = models::sim::KvMemoryBudget(
      *models::sim::FindGpu(p.flags.gpu), p.params, per_param, p.flags.tp,
      kActivationReserveFraction);
  p.hbm_bytes = b.hbm_bytes;
  p.weight_bytes_per_rank = b.weight_bytes_per_rank;
  p.reserve_bytes = b.reserve_bytes;
  p.budget_bytes = b.kv_bytes;
  if (p.budget_bytes == 0) {
    p.notes.push_back(absl::StrFormat(
        "weights (%s per rank) plus the %s activation reserve exceed the "
        "%s's %s: raise --tp or use smaller weights (--weight-bytes)",
        DecimalBytes(p.weight_bytes_per_rank), DecimalBytes(p.reserve_bytes),
        p.flags.gpu, DecimalBytes(p.hbm_bytes)));
  }
}

void AddKvHeadNotes(Plan& p) {
  const models::ModelConfig& c = p.config;
  const int tp = p.flags.tp;
  if (c.IsMla()) {
    if (tp > 1) {
      p.notes.push_back(absl::StrFormat(
          "tp=%d: the MLA latent is not split across heads; every rank stores "
          "all of it",
          tp));
    }
    return;
  }
  if (tp > c.num_kv_heads) {
    p.notes.push_back(absl::StrFormat(
        "tp=%d exceeds the %d KV heads: KV heads are replicated, each rank "
        "stores 1",
        tp, c.num_kv_heads));
  } else if (c.num_kv_heads % tp != 0) {
    p.notes.push_back(absl::StrFormat(
        "tp=%d does not divide the %d KV heads: ranks hold up to %d heads and "
        "are sized for the largest",
        tp, c.num_kv_heads, p.kv.kv_heads_per_rank));
  }
}

void AddModelNotes(Plan& p) {
  const models::ModelConfig& c = p.config;
  const int tp = p.flags.tp;
  AddKvHeadNotes(p);
  if (c.IsMla()) {
    p.notes.emplace_back(
        "parameter count not computed: the estimate counts dense layers only, "
        "not MLA projections or MoE experts");
  }
  if (c.num_heads % tp != 0) {
    p.notes.push_back(absl::StrFormat(
        "tp=%d does not divide the %d query heads; engines usually require it",
        tp, c.num_heads));
  }
  if (c.max_position > 0 && p.flags.context > c.max_position) {
    p.notes.push_back(absl::StrFormat(
        "--context %s exceeds the model's max_position %s",
        WithCommas(p.flags.context), WithCommas(c.max_position)));
  }
  if (c.sliding_window > 0 && p.flags.context > c.sliding_window) {
    p.notes.push_back(absl::StrFormat(
        "sliding window %s: a rolling-buffer cache would cap a sequence at "
        "%s bytes; these figures keep the full context",
        WithCommas(c.sliding_window),
        WithCommas(c.sliding_window * p.kv.bytes_per_token)));
  }
}

// Per-token KV of `kv_heads` full heads (K of qk_nope + qk_rope, V of
// v_head_dim) on one of p.flags.tp ranks, at the plan's dtype.
int64_t FullHeadBytesPerToken(const Plan& p, int kv_heads) {
  const models::ModelConfig& c = p.config;
  const KvDtype d = p.flags.kv_dtype;
  return int64_t{c.num_layers} * kvcache::KvHeadsPerRank(kv_heads, p.flags.tp) *
         (kvcache::KvRowBytes(d, c.qk_nope_head_dim + c.qk_rope_head_dim) +
          kvcache::KvRowBytes(d, c.v_head_dim));
}

void SetMlaComparison(Plan& p) {
  p.mha_equivalent_bytes_per_token =
      FullHeadBytesPerToken(p, p.config.num_heads);
  if (p.config.num_heads > 8) {
    p.gqa8_equivalent_bytes_per_token = FullHeadBytesPerToken(p, 8);
  }
}

}  // namespace

absl::StatusOr<Plan> BuildPlan(const std::string& model_label,
                               const models::ModelConfig& config,
                               const PlanFlags& flags) {
  Plan p;
  p.model_label = model_label;
  p.config = config;
  p.flags = flags;
  if (p.flags.context == 0) {
    p.flags.context =
        config.max_position > 0
            ? std::min<int64_t>(kDefaultContext, config.max_position)
            : kDefaultContext;
  }
  if (p.flags.mean_len > p.flags.context) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--mean-len (%d) must not exceed --context (%d)",
                        p.flags.mean_len, p.flags.context));
  }
  KV_RETURN_IF_ERROR(config.Validate());
  if (config.IsMla() && !p.flags.gpu.empty()) {
    return absl::InvalidArgumentError(
        "--gpu subtracts the weights, but kvserve does not count the "
        "parameters of an MLA/MoE model; pass the KV budget with --memory");
  }
  p.params = config.IsMla() ? 0 : models::EstimateParameterCount(config);
  if (!p.flags.gpu.empty()) {
    ApplyGpuBudget(p);
  } else if (p.flags.memory > 0) {
    p.budget = Plan::Budget::kMemory;
    p.budget_bytes = p.flags.memory;
  }
  const kvcache::KvPlanInput in = {.shape = models::KvShapeOf(config),
                                   .dtype = p.flags.kv_dtype,
                                   .tp = p.flags.tp,
                                   .block_size = p.flags.block_size,
                                   .context_len = p.flags.context,
                                   .naive_max_len = 0,
                                   .mean_len = p.flags.mean_len,
                                   .concurrency = p.flags.concurrency,
                                   .budget_bytes = p.budget_bytes};
  KV_RETURN_IF_ERROR(kvcache::ValidateKvPlanInput(in));
  p.kv = kvcache::ComputeKvPlan(in);
  if (config.IsMla()) SetMlaComparison(p);
  AddModelNotes(p);
  return p;
}

namespace {

std::string Line(std::string_view label, std::string_view value) {
  return absl::StrFormat("%-16s %s\n", label, value);
}

std::string BudgetText(const Plan& p) {
  switch (p.budget) {
    case Plan::Budget::kNone:
      return "none: pass --memory BYTES or --gpu NAME to size "
             "concurrency";
    case Plan::Budget::kMemory:
      return absl::StrFormat("%s bytes (%s) of KV per rank (--memory)",
                             WithCommas(p.budget_bytes),
                             DecimalBytes(p.budget_bytes));
    case Plan::Budget::kGpu:
      break;
  }
  const double per_param = p.flags.weight_bytes > 0
                               ? p.flags.weight_bytes
                               : p.config.weight_dtype_bytes;
  std::string text = absl::StrFormat(
      "%s %s HBM - weights %s (%s params x %g bytes / tp=%d) - reserve %s "
      "(%g%% for activations) = ",
      p.flags.gpu, DecimalBytes(p.hbm_bytes),
      DecimalBytes(p.weight_bytes_per_rank), ParamCount(p.params), per_param,
      p.flags.tp, DecimalBytes(p.reserve_bytes),
      100 * kActivationReserveFraction);
  if (p.budget_bytes == 0) return text + "nothing left for KV";
  return text + absl::StrFormat(
                    "%s bytes (%s) of KV per rank: %s blocks (what `kvserve "
                    "--device sim:%s` allocates)",
                    WithCommas(p.budget_bytes), DecimalBytes(p.budget_bytes),
                    WithCommas(p.kv.budget_blocks),
                    p.flags.tp > 1 ? absl::StrCat(p.flags.gpu, "x", p.flags.tp)
                                   : p.flags.gpu);
}

std::string ConcurrencyText(const Plan& p) {
  const kvcache::KvPlan& kv = p.kv;
  std::string text = absl::StrFormat(
      "paged: %s sequences at full context (%s tokens)",
      WithCommas(kv.paged_seqs_at_context), WithCommas(p.flags.context));
  if (p.flags.mean_len > 0) {
    absl::StrAppend(&text, ", ", WithCommas(kv.paged_seqs_at_mean),
                    " at mean length ", WithCommas(p.flags.mean_len));
  }
  absl::StrAppend(
      &text, "; naive max-length reservation: ", WithCommas(kv.naive_seqs));
  return text;
}

std::string RequestedText(const Plan& p) {
  const kvcache::KvPlan& kv = p.kv;
  std::string text = absl::StrFormat(
      "%s sequences x %s tokens = %s bytes (%s)%s",
      WithCommas(p.flags.concurrency), WithCommas(p.flags.context),
      WithCommas(kv.bytes_for_concurrency),
      DecimalBytes(kv.bytes_for_concurrency),
      p.flags.tp > 1 ? " per rank" : "");
  if (p.budget_bytes > 0) {
    absl::StrAppend(&text,
                    kv.concurrency_fits
                        ? ": fits the budget"
                        : absl::StrCat(": exceeds the budget by ",
                                       DecimalBytes(kv.bytes_for_concurrency -
                                                    p.budget_bytes)));
  }
  return text;
}

std::string ModelText(const Plan& p) {
  const models::ModelConfig& c = p.config;
  if (c.IsMla()) {
    return absl::StrFormat(
        "%s (L=%d, H=%d, MLA kv_lora_rank=%d qk_rope=%d qk_nope=%d v=%d, "
        "params not counted)",
        p.model_label, c.num_layers, c.num_heads, c.kv_lora_rank,
        c.qk_rope_head_dim, c.qk_nope_head_dim, c.v_head_dim);
  }
  return absl::StrFormat("%s (L=%d, H=%d, H_kv=%d, D=%d, %s params)",
                         p.model_label, c.num_layers, c.num_heads,
                         c.num_kv_heads, c.head_dim, ParamCount(p.params));
}

std::string DtypeText(const Plan& p) {
  const double elem_bytes = kvcache::KvBytesPerElement(p.flags.kv_dtype);
  std::string dtype = absl::StrFormat(
      "%s (%g byte%s), tp=%d", kvcache::KvDtypeName(p.flags.kv_dtype),
      elem_bytes, elem_bytes == 1 ? "" : "s", p.flags.tp);
  if (p.flags.tp > 1 && p.config.IsMla()) {
    absl::StrAppend(&dtype, ": the whole MLA latent on every rank");
  } else if (p.flags.tp > 1) {
    absl::StrAppend(&dtype, ": ", p.kv.kv_heads_per_rank, " of ",
                    p.config.num_kv_heads, " KV heads per rank");
  }
  return dtype;
}

// "71.1x": how many times the MLA figure `bytes` is.
std::string Ratio(const Plan& p, int64_t bytes) {
  return absl::StrFormat("%.1fx",
                         static_cast<double>(bytes) / p.kv.bytes_per_token);
}

// MLA only: the latent and what full K/V heads would cache instead.
std::string AttentionLines(const Plan& p) {
  const models::ModelConfig& c = p.config;
  const char* per_rank = p.flags.tp > 1 ? " per rank" : "";
  std::string out = Line(
      "attention",
      absl::StrFormat("MLA: latent %d + rope %d per layer; as MHA it would "
                      "need %s bytes/token%s (%s)",
                      c.kv_lora_rank, c.qk_rope_head_dim,
                      WithCommas(p.mha_equivalent_bytes_per_token), per_rank,
                      Ratio(p, p.mha_equivalent_bytes_per_token)));
  const std::string heads =
      absl::StrFormat("KV heads x (K %d + V %d) x %d layers at %s",
                      c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim,
                      c.num_layers, kvcache::KvDtypeName(p.flags.kv_dtype));
  absl::StrAppend(&out,
                  Line("as MHA", absl::StrFormat("%d %s", c.num_heads, heads)));
  if (p.gqa8_equivalent_bytes_per_token > 0) {
    absl::StrAppend(
        &out, Line("as GQA-8",
                   absl::StrFormat(
                       "8 %s = %s bytes/token%s (%s)", heads,
                       WithCommas(p.gqa8_equivalent_bytes_per_token), per_rank,
                       Ratio(p, p.gqa8_equivalent_bytes_per_token))));
  }
  return out;
}

}  // namespace

std::string FormatPlan(const Plan& p) {
  const kvcache::KvPlan& kv = p.kv;
  const char* per_rank = p.flags.tp > 1 ? " per rank" : "";
  std::string out = Line("model", ModelText(p));
  if (!p.weight_bytes_by_type.empty()) {
    absl::StrAppend(
        &out,
        Line("weights", models::FileBytesByTypeText(p.weight_bytes_by_type)));
  }
  absl::StrAppend(&out, Line("kv dtype", DtypeText(p)));
  absl::StrAppend(
      &out, Line("bytes per token",
                 absl::StrFormat("%s (%s)%s", WithCommas(kv.bytes_per_token),
                                 BinaryBytes(kv.bytes_per_token), per_rank)));
  if (p.config.IsMla()) absl::StrAppend(&out, AttentionLines(p));
  std::string seq =
      absl::StrFormat("%s tokens = %s bytes (%s)%s, %s blocks of %d",
                      WithCommas(p.flags.context), WithCommas(kv.bytes_per_seq),
                      DecimalBytes(kv.bytes_per_seq), per_rank,
                      WithCommas(kv.blocks_per_seq), p.flags.block_size);
  if (kv.paged_bytes_per_seq != kv.bytes_per_seq) {
    absl::StrAppend(&seq, " = ", WithCommas(kv.paged_bytes_per_seq),
                    " bytes paged");
  }
  absl::StrAppend(&out, Line("per sequence", seq));
  absl::StrAppend(&out, Line("budget", BudgetText(p)));
  if (p.budget_bytes > 0) {
    absl::StrAppend(&out, Line("concurrency", ConcurrencyText(p)));
  }
  if (p.flags.concurrency > 0) {
    absl::StrAppend(&out, Line("requested", RequestedText(p)));
  }
  if (p.flags.mean_len > 0) {
    absl::StrAppend(
        &out, Line("idle KV",
                   absl::StrFormat("naive reservation at mean length %s: %s "
                                   "of reserved KV unused; paging: %s",
                                   WithCommas(p.flags.mean_len),
                                   Percent(kv.naive_idle_fraction),
                                   Percent(kv.paged_idle_fraction))));
  }
  if (const std::optional<PlanRoofline> r = ComputePlanRoofline(p)) {
    absl::StrAppend(&out, RooflineText(*r));
  }
  absl::StrAppend(&out, TiersText(ComputePlanTiers(p)));
  for (const std::string& note : p.notes)
    absl::StrAppend(&out, Line("note", note));
  return out;
}

std::string FormatPlanJson(const Plan& p) {
  const models::ModelConfig& c = p.config;
  const kvcache::KvPlan& kv = p.kv;
  nlohmann::ordered_json j;
  j["model"] = p.model_label;
  j["architecture"] = {{"num_layers", c.num_layers},
                       {"num_heads", c.num_heads},
                       {"num_kv_heads", c.num_kv_heads},
                       {"head_dim", c.head_dim},
                       {"params", p.params}};
  if (c.IsMla()) {
    j["architecture"]["params"] = nullptr;  // not counted
    j["attention"] = "mla";
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["qk_rope_head_dim"] = c.qk_rope_head_dim;
    j["qk_nope_head_dim"] = c.qk_nope_head_dim;
    j["v_head_dim"] = c.v_head_dim;
    j["mha_equivalent_bytes_per_token"] = p.mha_equivalent_bytes_per_token;
    if (p.gqa8_equivalent_bytes_per_token > 0) {
      j["gqa8_equivalent_bytes_per_token"] = p.gqa8_equivalent_bytes_per_token;
    }
  } else {
    j["attention"] = c.num_kv_heads == c.num_heads ? "mha" : "gqa";
  }
  if (!p.weight_bytes_by_type.empty()) {
    int64_t total = 0;
    for (const auto& [type, bytes] : p.weight_bytes_by_type) total += bytes;
    j["weights"] = {{"bytes", total},
                    {"bytes_by_type", p.weight_bytes_by_type}};
  }
  j["kv_dtype"] = std::string(kvcache::KvDtypeName(p.flags.kv_dtype));
  j["kv_dtype_bytes"] = kvcache::KvBytesPerElement(p.flags.kv_dtype);
  j["tp"] = p.flags.tp;
  j["kv_heads_per_rank"] = kv.kv_heads_per_rank;
  j["block_size"] = p.flags.block_size;
  j["context"] = p.flags.context;
  j["bytes_per_token"] = kv.bytes_per_token;
  j["bytes_per_block"] = kv.bytes_per_block;
  j["bytes_per_sequence"] = kv.bytes_per_seq;
  j["blocks_per_sequence"] = kv.blocks_per_seq;
  j["paged_bytes_per_sequence"] = kv.paged_bytes_per_seq;
  static constexpr const char* kSources[] = {"none", "memory", "gpu"};
  j["budget"] = {{"source", kSources[static_cast<int>(p.budget)]},
                 {"kv_bytes", p.budget_bytes}};
  if (p.budget == Plan::Budget::kGpu) {
    j["budget"]["gpu"] = p.flags.gpu;
    j["budget"]["hbm_bytes"] = p.hbm_bytes;
    j["budget"]["weight_bytes_per_rank"] = p.weight_bytes_per_rank;
    j["budget"]["reserve_bytes"] = p.reserve_bytes;
  }
  if (p.budget_bytes > 0) {
    j["concurrency"] = {{"budget_blocks", kv.budget_blocks},
                        {"paged_at_context", kv.paged_seqs_at_context},
                        {"naive", kv.naive_seqs}};
    if (p.flags.mean_len > 0) {
      j["concurrency"]["paged_at_mean"] = kv.paged_seqs_at_mean;
    }
  }
  if (p.flags.concurrency > 0) {
    j["requested"] = {{"sequences", p.flags.concurrency},
                      {"bytes", kv.bytes_for_concurrency}};
    if (p.budget_bytes > 0) j["requested"]["fits"] = kv.concurrency_fits;
  }
  if (p.flags.mean_len > 0) {
    j["idle"] = {{"mean_len", p.flags.mean_len},
                 {"naive_fraction", kv.naive_idle_fraction},
                 {"paged_fraction", kv.paged_idle_fraction},
                 {"naive_bytes_per_sequence", kv.naive_idle_bytes_per_seq},
                 {"paged_bytes_per_sequence", kv.paged_idle_bytes_per_seq}};
  }
  if (const std::optional<PlanRoofline> r = ComputePlanRoofline(p)) {
    j["roofline"] = RooflineJson(*r);
  }
  if (std::vector<PlanTier> tiers = ComputePlanTiers(p); !tiers.empty()) {
    j["tiers"] = TiersJson(tiers);
  }
  j["notes"] = p.notes;
  return j.dump() + "\n";
}

std::string PlanUsage() {
  PlanArgs a;
  CliArgs cli("plan");
  RegisterPlanFlags(&a, &cli);
  return cli.Usage();
}

namespace {

// The config of an HF directory whose config.json is MLA, read without
// weights (the file loader refuses MLA); nullopt for anything else.
absl::StatusOr<std::optional<models::ModelConfig>> LoadMlaConfig(
    const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path config = fs::path(path) / "config.json";
  if (!fs::is_directory(path, ec) || !fs::is_regular_file(config, ec)) {
    return std::nullopt;
  }
  KV_ASSIGN_OR_RETURN(const std::string text,
                      models::ReadFileToString(config.string()));
  if (!models::IsMlaHfConfig(text)) return std::nullopt;
  KV_ASSIGN_OR_RETURN(models::ModelConfig c,
                      models::ParseHfSizingConfig(text, config.string()));
  return c;
}

// Architecture numbers for --model: a preset needs no files; anything else
// is resolved to a path and read by `loader`.
absl::StatusOr<std::pair<std::string, PlanModel>> LoadPlanConfig(
    const std::string& model, const ConfigLoader& loader) {
  if (const models::ModelPreset* preset = models::FindPreset(model)) {
    return std::make_pair(preset->name, PlanModel{.config = preset->config});
  }
  KV_ASSIGN_OR_RETURN(std::string path, models::ResolveModelPath(model));
  KV_ASSIGN_OR_RETURN(std::optional<models::ModelConfig> mla,
                      LoadMlaConfig(path));
  if (mla.has_value()) {
    return std::make_pair(path, PlanModel{.config = *std::move(mla)});
  }
  if (!loader) {
    return absl::UnimplementedError(absl::StrCat(
        "model '", model, "' resolved to ", path,
        ", but loading config from files is not wired yet; use a preset: ",
        models::PresetNames()));
  }
  KV_ASSIGN_OR_RETURN(PlanModel loaded, loader(path));
  return std::make_pair(path, std::move(loaded));
}

}  // namespace

int RunPlan(const std::vector<std::string>& args, const ConfigLoader& loader,
            std::string* out, std::string* err) {
  absl::StatusOr<PlanFlags> flags = ParsePlanFlags(args);
  if (!flags.ok()) {
    absl::StrAppend(err, "kvserve plan: ", flags.status().message(), "\n");
    return 2;
  }
  if (flags->help) {
    absl::StrAppend(out, PlanUsage());
    return 0;
  }
  if (flags->model.empty()) {
    absl::StrAppend(err, "kvserve plan: --model is required\n", PlanUsage());
    return 2;
  }
  auto loaded = LoadPlanConfig(flags->model, loader);
  if (!loaded.ok()) {
    absl::StrAppend(err, "kvserve plan: ", loaded.status().message(), "\n");
    return 1;
  }
  absl::StatusOr<Plan> plan =
      BuildPlan(loaded->first, loaded->second.config, *flags);
  if (!plan.ok()) {
    absl::StrAppend(err, "kvserve plan: ", plan.status().message(), "\n");
    return 2;
  }
  plan->weight_bytes_by_type = std::move(loaded->second.weight_bytes_by_type);
  absl::StrAppend(out, flags->json ? FormatPlanJson(*plan) : FormatPlan(*plan));
  return 0;
}

int RunPlanCommand(int argc, const char* const* argv,
                   const ConfigLoader& loader) {
  int first = 1;
  if (first < argc && std::string_view(argv[first]) == "plan") ++first;
  std::vector<std::string> args;
  for (int i = first; i < argc; ++i) args.emplace_back(argv[i]);
  std::string out, err;
  const int rc = RunPlan(args, loader, &out, &err);
  std::fputs(out.c_str(), stdout);
  std::fputs(err.c_str(), stderr);
  return rc;
}

}  // namespace kvserve::cli
