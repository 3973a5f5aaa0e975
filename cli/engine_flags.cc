#include "cli/engine_flags.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cli/kv_dtype_flag.h"
#include "cli/sim_profile.h"
#include "common/status_macros.h"
#include "common/system.h"
#include "kvcache/kv_format.h"
#include "kvtier/redis_client.h"
#include "models/loader/mapped_file.h"
#include "scheduler/scheduler_config.h"

namespace kvserve::cli {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMiB = int64_t{1} << 20;

// "4GiB", "512MiB" or "1000" (bytes), for help text.
std::string BytesText(int64_t bytes) {
  if (bytes > 0 && bytes % kGiB == 0) return absl::StrCat(bytes / kGiB, "GiB");
  if (bytes > 0 && bytes % kMiB == 0) return absl::StrCat(bytes / kMiB, "MiB");
  return absl::StrCat(bytes);
}

void RegisterModelFlags(EngineFlags* f, CliArgs* args) {
  args->String("model", &f->model,
               absl::StrCat("preset name, .gguf file, or HF directory "
                            "(default ",
                            f->model, ")"));
  args->Int("threads", &f->threads, "CPU compute threads (default 0 = all)", 0,
            1024);
}

void RegisterDeviceFlags(EngineFlags* f, CliArgs* args) {
  args->String("device", &f->device,
               absl::StrCat("where the model runs: cpu, cuda, auto, or "
                            "sim:<gpu>[x<tp>] (h100, h200, a100, l40s: no "
                            "weights, simulated tokens and step times; "
                            "default ",
                            f->device, ")"));
  args->String("kv-cache-dtype", &f->kv_cache_dtype,
               absl::StrCat("KV element type: ", kKvDtypeAutoHelp,
                            ", f32, fp16, bf16, int8 (q8_0 layout), int4 "
                            "(q4_0 layout), int3 or int2 (KIVI: keys per "
                            "channel over 32 tokens, --block-size a "
                            "multiple of 32) on the CPU; bf16, fp8 (e4m3) or "
                            "int8 (q8_0, --block-size a multiple of 4) on "
                            "CUDA (default ",
                            f->kv_cache_dtype, ")"));
  args->Int("block-size", &f->block_size,
            absl::StrCat("tokens per KV cache block (default ",
                         f->default_block_size, "; whole key groups of ",
                         kvcache::kKvKeyGroupTokens, " for int3 and int2)"),
            1, 1024);
}

void RegisterBatchFlags(EngineFlags* f, CliArgs* args) {
  args->Int("max-num-seqs", &f->max_num_seqs,
            absl::StrCat("most requests running at once (default ",
                         f->max_num_seqs, ")"),
            1, 65536);
  args->Int("max-num-batched-tokens", &f->max_num_batched_tokens,
            absl::StrCat("token budget of one engine step (default ",
                         f->max_num_batched_tokens, ")"),
            1, 1 << 22);
  args->String("speculative", &f->speculative,
               absl::StrCat("speculative decoding: off, ngram (prompt "
                            "lookup: drafts copied from earlier in the prompt "
                            "and output) or draft (a smaller model with the "
                            "same tokenizer, --speculative-draft-model); "
                            "drafts are verified in the batched step and the "
                            "outputs do not change (default ",
                            f->speculative, ")"));
  args->String("speculative-draft-model", &f->speculative_draft_model,
               "--speculative draft: the draft model (a GGUF file or HF "
               "directory with the target's tokenizer), run on the CPU with "
               "a KV pool of its own");
  args->Float("speculative-draft-p-min", &f->speculative_draft_p_min,
              absl::StrCat("--speculative draft: stop drafting a sequence at "
                           "a token the draft gives less probability (default ",
                           f->speculative_draft_p_min, ")"),
              0.0, 1.0);
  args->Int("num-speculative-tokens", &f->num_speculative_tokens,
            absl::StrCat("--speculative: most draft tokens a sequence "
                         "verifies per step (default ",
                         f->num_speculative_tokens, ")"),
            1, 64);
  args->Int("speculative-max-batch", &f->speculative_max_batch,
            absl::StrCat("--speculative: no drafts while more sequences than "
                         "this decode (under load a draft costs more than it "
                         "saves) (default ",
                         f->speculative_max_batch, ")"),
            1, 65536);
  args->Int("structured-output-max-compiles",
            &f->structured_output_max_compiles,
            absl::StrCat("structured output: grammars compiling at once; a "
                         "request past it gets 429 (default ",
                         f->structured_output_max_compiles, ")"),
            1, 64);
  args->Float("structured-output-compile-timeout",
              &f->structured_output_compile_timeout_s,
              absl::StrCat("structured output: seconds a request waits for its "
                           "grammar's compile (which finishes and is cached "
                           "anyway) (default ",
                           f->structured_output_compile_timeout_s, ")"),
              0.001, 3600);
  args->Bool("structured-output-overlap", &f->structured_output_overlap,
             absl::StrCat("structured output: compute grammar masks on a "
                          "thread of their own while the forward runs "
                          "(default ",
                          f->structured_output_overlap ? "on" : "off", ")"));
  args->String("kv-reservation", &f->kv_reservation,
               absl::StrCat("paged (allocate KV blocks as tokens arrive) or "
                            "max-length (each request holds a max-model-len "
                            "slab from admission: the contiguous baseline) "
                            "(default ",
                            f->kv_reservation, ")"));
  args->Bool("prefix-caching", &f->prefix_caching,
             absl::StrCat("share KV blocks of common prompt prefixes "
                          "(default ",
                          f->prefix_caching ? "on" : "off",
                          "; --no-prefix-caching turns it off)"));
}

void RegisterPoolFlags(EngineFlags* f, CliArgs* args) {
  args->Bytes("kv-cache-bytes", &f->kv_cache_bytes,
              absl::StrCat("KV cache size, e.g. 512MiB (default ",
                           BytesText(f->kv_cache_bytes),
                           f->kv_cache_bytes == 0
                               ? " = the device's rule: --kv-cache-fraction "
                                 "of memory on the CPU, --gpu-memory-fraction "
                                 "on a GPU"
                               : "",
                           ")"));
  args->Float("kv-cache-fraction", &f->kv_cache_fraction,
              absl::StrCat("share of physical memory for the KV cache when "
                           "--kv-cache-bytes is 0 (default ",
                           f->kv_cache_fraction, ")"),
              0.001, 0.95);
  args->Float("gpu-memory-fraction", &f->gpu_memory_fraction,
              absl::StrCat("share of GPU memory for weights, activations "
                           "and KV on a GPU (default ",
                           f->gpu_memory_fraction, ")"),
              0.01, 1);
  args->Bytes("swap-space-bytes", &f->swap_space_bytes,
              absl::StrCat("host memory for KV blocks of requests preempted "
                           "by swap, e.g. 2GiB (default ",
                           f->swap_space_bytes < 0
                               ? "4GiB, at most 1/8 of memory, 0 below 4GiB "
                                 "of memory"
                               : BytesText(f->swap_space_bytes),
                           "; 0 = swapping off)"));
  args->String("preemption-mode", &f->preemption_mode,
               absl::StrCat("auto (per victim, the cheaper of recompute and "
                            "swap), recompute, or swap (default ",
                            f->preemption_mode, ")"));
  args->Bytes("kv-host-cache-bytes", &f->kv_host_cache_bytes,
              "pinned host memory for KV blocks below a device pool (--device "
              "cuda): prefixes written through to it are copied back after "
              "eviction, and the disk and remote tiers stage through it "
              "(needed by them on cuda); its own memory, not the swap "
              "space's (default 0: off)");
  args->String("kv-disk-cache", &f->kv_disk_cache,
               "a directory for KV blocks below the pool: prefixes written "
               "through to it are loaded back after eviction or a restart "
               "(on cuda through --kv-host-cache-bytes; the directory must "
               "be this user's and not writable by others; default off)");
  args->Bytes("kv-disk-cache-bytes", &f->kv_disk_cache_bytes,
              "bytes --kv-disk-cache may hold, least recently used blocks "
              "evicted first (default 10% of its file system, at most "
              "64GiB)");
  args->String("kv-remote-cache", &f->kv_remote_cache,
               "redis://HOST[:PORT][/DB]: a Redis or Valkey that replicas "
               "share KV blocks through, below the pool and the disk (on "
               "cuda through --kv-host-cache-bytes; no TLS: a private network "
               "or a TLS tunnel; needs a "
               "password; default off)");
  args->String("kv-remote-cache-user", &f->kv_remote_cache_user,
               "the ACL user of --kv-remote-cache (default: the default "
               "user)");
  args->String("kv-remote-cache-password-file",
               &f->kv_remote_cache_password_file,
               "a file holding --kv-remote-cache's password (its first "
               "line); else the environment variable KVSERVE_REDIS_PASSWORD");
  args->Int("kv-remote-cache-timeout-ms", &f->kv_remote_cache_timeout_ms,
            "bound on one round trip to --kv-remote-cache (default 500)", 1,
            60000);
  args->String("kv-tier-encryption-key-file", &f->kv_tier_encryption_key_file,
               "seal the disk and remote tiers' blocks (AES-256-GCM) with the "
               "32-byte key in this file (raw or 64 hex digits; mode 600), so "
               "a stolen disk or a shared store holds no readable prompts "
               "(default off)");
  args->Int("kv-remote-cache-ttl", &f->kv_remote_cache_ttl,
            "seconds a stored block lives in --kv-remote-cache (default 0: "
            "no expiry; let the store's maxmemory-policy allkeys-lru evict)",
            0, int64_t{10} * 365 * 86400);
}

void RegisterSimFlags(EngineFlags* f, CliArgs* args) {
  engine::SimConfig& s = f->sim;
  args->Float("sim-weight-bytes", &s.weight_bytes,
              "--device sim: bytes per weight parameter (2 bf16, 1 fp8, 0.5 "
              "int4; default 0 = the model's dtype)",
              0, 8);
  args->String("sim-profile", &f->sim_profile,
               "--device sim: a measured step profile (kvserve sim-replay "
               "--profile-out) instead of the roofline");
  args->Float("sim-memory-efficiency", &f->sim_memory_efficiency,
              absl::StrCat("--device sim: share of the GPU's memory "
                           "bandwidth a step reaches (default ",
                           f->sim_memory_efficiency, ")"),
              0.01, 1);
  args->Float("sim-flops-efficiency", &f->sim_flops_efficiency,
              absl::StrCat("--device sim: share of the GPU's dense matrix "
                           "rate a step reaches (default ",
                           f->sim_flops_efficiency, ")"),
              0.01, 1);
  args->Float("sim-host-us-per-seq", &f->sim_host_us_per_seq,
              absl::StrCat("--device sim: the host's microseconds per "
                           "sequence of a step (default ",
                           f->sim_host_us_per_seq, ")"),
              0, 1000);
}

void RegisterSimPaceFlags(EngineFlags* f, CliArgs* args) {
  args->Float("sim-speed", &f->sim.speed,
              absl::StrCat("--device sim: simulated seconds per real second "
                           "(1 = real time; 0 = no sleeping at all; default ",
                           f->sim.speed, ")"),
              0, 1e9);
  args->Int("sim-seed", &f->sim_seed,
            absl::StrCat("--device sim: seed of the simulated token ids "
                         "(default ",
                         f->sim_seed, ")"),
            0, INT64_MAX);
}

// The tiers' encryption key file, the remote tier's target and credentials:
// the password from a file or the environment, never a flag value (it
// would show in `ps`).
absl::Status ApplyRemoteCacheFlags(const EngineFlags& f,
                                   engine::KvTierConfig* t) {
  t->remote_url = f.kv_remote_cache;
  t->remote_user = f.kv_remote_cache_user;
  t->remote_timeout = absl::Milliseconds(f.kv_remote_cache_timeout_ms);
  t->remote_ttl_seconds = f.kv_remote_cache_ttl;
  t->encryption_key_file = f.kv_tier_encryption_key_file;
  if (!t->encryption_key_file.empty() && f.kv_remote_cache.empty() &&
      f.kv_disk_cache.empty()) {
    return absl::InvalidArgumentError(
        "--kv-tier-encryption-key-file: needs --kv-disk-cache or "
        "--kv-remote-cache (it seals their blocks)");
  }
  if (f.kv_remote_cache.empty()) return absl::OkStatus();
  KV_RETURN_IF_ERROR(kvtier::ParseRedisUrl(f.kv_remote_cache).status());
  if (!f.kv_remote_cache_password_file.empty()) {
    absl::StatusOr<std::string> text =
        models::ReadFileToString(f.kv_remote_cache_password_file);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-remote-cache-password-file: ", text.status().message()));
    }
    t->remote_password = std::string(
        absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
  } else if (const char* env = std::getenv("KVSERVE_REDIS_PASSWORD")) {
    t->remote_password = env;
  }
  if (t->remote_password.empty()) {
    return absl::InvalidArgumentError(
        "--kv-remote-cache: the store holds prompts and needs a password: "
        "--kv-remote-cache-password-file FILE or KVSERVE_REDIS_PASSWORD");
  }
  return absl::OkStatus();
}

}  // namespace

int64_t DefaultSwapSpaceBytes() {
  const int64_t mem = PhysicalMemoryBytes();
  if (mem < 4 * kGiB) return 0;
  return std::min<int64_t>(4 * kGiB, mem / 8);
}

EngineFlags EngineFlagsFrom(const engine::EngineConfig& defaults,
                            std::string model, std::string device) {
  const scheduler::SchedulerConfig& s = defaults.scheduler;
  EngineFlags f;
  f.model = std::move(model);
  f.device = std::move(device);
  f.block_size = 0;
  f.default_block_size = s.block_size;
  f.max_num_seqs = s.max_num_seqs;
  f.max_num_batched_tokens = s.max_num_batched_tokens;
  f.kv_reservation =
      std::string(scheduler::KvReservationName(s.kv_reservation));
  f.prefix_caching = s.enable_prefix_caching;
  f.preemption_mode =
      std::string(scheduler::PreemptionModeName(s.preemption_mode));
  f.kv_cache_bytes = defaults.kv_cache_bytes;
  f.kv_cache_fraction = defaults.kv_cache_fraction;
  f.gpu_memory_fraction = defaults.gpu_memory_fraction;
  f.sim = defaults.sim;
  f.sim_memory_efficiency =
      defaults.sim.memory_efficiency.value_or(f.sim_memory_efficiency);
  f.sim_flops_efficiency =
      defaults.sim.flops_efficiency.value_or(f.sim_flops_efficiency);
  f.sim_host_us_per_seq =
      defaults.sim.host_us_per_seq.value_or(f.sim_host_us_per_seq);
  return f;
}

void RegisterEngineFlags(EngineFlags* f, uint32_t groups, CliArgs* args) {
  if (groups & kModelFlags) RegisterModelFlags(f, args);
  if (groups & kDeviceFlags) RegisterDeviceFlags(f, args);
  if (groups & kBatchFlags) RegisterBatchFlags(f, args);
  if (groups & kPoolFlags) RegisterPoolFlags(f, args);
  if (groups & kSimFlags) RegisterSimFlags(f, args);
  if (groups & kSimPaceFlags) RegisterSimPaceFlags(f, args);
}

absl::Status ApplyEngineFlags(const EngineFlags& f, uint32_t groups,
                              engine::EngineConfig* e) {
  scheduler::SchedulerConfig& s = e->scheduler;
  if (groups & kDeviceFlags) {
    engine::SimConfig sim = f.sim;
    sim.seed = static_cast<uint64_t>(f.sim_seed);
    if (groups & kSimFlags) {
      sim.memory_efficiency = f.sim_memory_efficiency;
      sim.flops_efficiency = f.sim_flops_efficiency;
      sim.host_us_per_seq = f.sim_host_us_per_seq;
    }
    KV_RETURN_IF_ERROR(ApplyDeviceFlags(f.device, sim, f.sim_profile, e));
    KV_ASSIGN_OR_RETURN(e->kv_cache_dtype,
                        ParseKvCacheDtypeFlag(f.kv_cache_dtype));
    if (f.block_size > 0) {
      s.block_size = static_cast<int32_t>(f.block_size);
    } else {
      s.block_size = static_cast<int32_t>(f.default_block_size);
      if (e->kv_cache_dtype.has_value()) {
        s.block_size =
            kvcache::KvDtypeDefaultBlockSize(*e->kv_cache_dtype, s.block_size);
      }
    }
  }
  if (groups & kBatchFlags) {
    s.max_num_seqs = static_cast<int32_t>(f.max_num_seqs);
    s.max_num_batched_tokens = static_cast<int32_t>(f.max_num_batched_tokens);
    KV_ASSIGN_OR_RETURN(s.kv_reservation,
                        scheduler::ParseKvReservation(f.kv_reservation));
    s.enable_prefix_caching = f.prefix_caching;
    KV_ASSIGN_OR_RETURN(e->speculative.mode,
                        engine::ParseSpeculativeMode(f.speculative));
    e->speculative.num_tokens = static_cast<int32_t>(f.num_speculative_tokens);
    e->speculative.max_decode_batch =
        static_cast<int32_t>(f.speculative_max_batch);
    e->speculative.draft_model = f.speculative_draft_model;
    e->speculative.draft_p_min = static_cast<float>(f.speculative_draft_p_min);
    e->structured_output.max_concurrent =
        static_cast<int32_t>(f.structured_output_max_compiles);
    e->structured_output.timeout =
        absl::Seconds(f.structured_output_compile_timeout_s);
    e->structured_output_overlap = f.structured_output_overlap;
    const bool draft = e->speculative.mode == engine::SpeculativeMode::kDraft;
    if (draft == f.speculative_draft_model.empty()) {
      return absl::InvalidArgumentError(
          draft ? "--speculative draft: needs --speculative-draft-model"
                : "--speculative-draft-model: needs --speculative draft");
    }
  }
  if (groups & kPoolFlags) {
    e->kv_cache_bytes = f.kv_cache_bytes;
    e->kv_cache_fraction = f.kv_cache_fraction;
    e->gpu_memory_fraction = f.gpu_memory_fraction;
    e->swap_space_bytes =
        f.swap_space_bytes >= 0 ? f.swap_space_bytes : DefaultSwapSpaceBytes();
    KV_ASSIGN_OR_RETURN(s.preemption_mode,
                        scheduler::ParsePreemptionMode(f.preemption_mode));
    e->kv_tiers.disk_dir = f.kv_disk_cache;
    e->kv_tiers.disk_bytes = f.kv_disk_cache_bytes;
    if (f.kv_disk_cache_bytes < 0) {
      return absl::InvalidArgumentError("--kv-disk-cache-bytes: must be >= 0");
    }
    if (f.kv_host_cache_bytes < 0) {
      return absl::InvalidArgumentError("--kv-host-cache-bytes: must be >= 0");
    }
    e->kv_tiers.host_bytes = f.kv_host_cache_bytes;
    KV_RETURN_IF_ERROR(ApplyRemoteCacheFlags(f, &e->kv_tiers));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::cli
