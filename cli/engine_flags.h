// EngineFlags: the flags that configure the engine, registered in one place
// for every command that runs one (serve, generate, eval, sim-replay). A
// command starts from its defaults (EngineFlagsFrom: an EngineConfig, a
// model and a device), registers the groups it takes, and applies the parsed
// values to its EngineConfig once (ApplyEngineFlags). Every help line prints
// its default from the value the flag starts with, so each default is
// written once, in the config or in the command's own starting values.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/cli_args.h"
#include "engine/engine.h"
#include "models/sim/roofline.h"

namespace kvserve::cli {

struct EngineFlags {
  std::string model;
  int64_t threads = 0;  // CPU compute threads; 0: all
  std::string device;
  std::string kv_cache_dtype = "auto";
  int64_t block_size = 0;           // 0: not given, the dtype's default
  int64_t default_block_size = 16;  // rounded up to key groups for int3/int2
  int64_t max_num_seqs = 0, max_num_batched_tokens = 0;
  std::string kv_reservation;
  std::string speculative = "off";  // --speculative
  std::string speculative_draft_model;
  double speculative_draft_p_min = 0.0;
  int64_t num_speculative_tokens = 8;
  int64_t speculative_max_batch = 4;
  int64_t structured_output_max_compiles = 2;
  double structured_output_compile_timeout_s = 10;
  bool structured_output_overlap = false;
  bool prefix_caching = true;
  int64_t kv_cache_bytes = 0;
  double kv_cache_fraction = 0, gpu_memory_fraction = 0;
  int64_t swap_space_bytes = -1;  // -1: DefaultSwapSpaceBytes()
  std::string preemption_mode;
  std::string kv_disk_cache;
  int64_t kv_disk_cache_bytes = 0;
  int64_t kv_host_cache_bytes = 0;  // --kv-host-cache-bytes
  std::string kv_remote_cache;      // redis://HOST:PORT[/DB]
  std::string kv_remote_cache_user;
  std::string kv_remote_cache_password_file;
  int64_t kv_remote_cache_timeout_ms = 500;
  int64_t kv_remote_cache_ttl = 0;
  std::string kv_tier_encryption_key_file;
  engine::SimConfig sim;  // gpu and tp come from --device
  int64_t sim_seed = 0;
  // --sim-*-efficiency, --sim-host-us-per-seq: into sim's optionals.
  double sim_memory_efficiency = models::sim::Efficiency{}.memory;
  double sim_flops_efficiency = models::sim::Efficiency{}.flops;
  double sim_host_us_per_seq = models::sim::Efficiency{}.host_s_per_seq * 1e6;
  std::string sim_profile;
};

// Groups of flags a command registers, ORed.
enum EngineFlagGroup : uint32_t {
  kModelFlags = 1u << 0,   // --model, --threads
  kDeviceFlags = 1u << 1,  // --device, --kv-cache-dtype, --block-size
  // --max-num-seqs, --max-num-batched-tokens, --kv-reservation,
  // --prefix-caching
  kBatchFlags = 1u << 2,
  // --kv-cache-bytes, --kv-cache-fraction, --gpu-memory-fraction,
  // --swap-space-bytes, --preemption-mode, --kv-host-cache-bytes,
  // --kv-disk-cache, --kv-disk-cache-bytes
  kPoolFlags = 1u << 3,
  // --sim-weight-bytes, --sim-*-efficiency, --sim-host-us-per-seq,
  // --sim-profile
  kSimFlags = 1u << 4,
  kSimPaceFlags = 1u << 5,  // --sim-speed, --sim-seed (real-time serving)
  kAllEngineFlags = (1u << 6) - 1,
};

// The flags' starting values: `defaults`' own, with `model` and `device`.
[[nodiscard]] EngineFlags EngineFlagsFrom(const engine::EngineConfig& defaults,
                                          std::string model,
                                          std::string device);

// Registers the flags of `groups` on `args`, writing into `f`.
void RegisterEngineFlags(EngineFlags* f, uint32_t groups, CliArgs* args);

// Applies the flags of `groups` to `e`; InvalidArgument naming the flag
// for a value none of them accepts.
[[nodiscard]] absl::Status ApplyEngineFlags(const EngineFlags& f,
                                            uint32_t groups,
                                            engine::EngineConfig* e);

// Host swap space when --swap-space-bytes is not given: 4 GiB, at most an
// eighth of physical memory, and none below 4 GiB of memory. The CPU backend
// allocates it lazily (pages are touched only by swapped-out blocks).
[[nodiscard]] int64_t DefaultSwapSpaceBytes();

}  // namespace kvserve::cli
