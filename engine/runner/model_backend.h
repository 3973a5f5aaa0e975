// The seam between the engine and the device the model runs on. A backend
// owns the model weights in their device form, the KV block storage (device
// memory on a GPU, host memory on the CPU), and the host swap space. The
// engine thread alone calls it; block bookkeeping (which block belongs to
// whom, which swap slot holds what) stays in kvcache/ and scheduler/, which
// know nothing about devices.
//
// Per step the engine calls, in this order: SwapOut, SwapIn, CopyBlocks (as
// the scheduler planned them), then Forward.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/runner/device.h"
#include "engine/runner/host_kv_copier.h"
#include "kvcache/block_pool.h"
#include "kvcache/kv_sizing.h"
#include "kvtier/block_codec.h"
#include "models/forward_batch.h"
#include "scheduler/scheduler_config.h"

namespace kvserve::engine {

struct LoadedModel;

// One block move: `src` and `dst` are KV block ids, or swap slot ids for the
// host side of SwapOut (dst) and SwapIn (src). The scheduler's own type, so
// SchedulerOutput's move lists pass to the backend as they are.
using BlockMove = kvcache::BlockMove;

// The defaults EngineConfig and BackendConfig share.
inline constexpr double kDefaultKvCacheFraction = 0.25;
inline constexpr double kDefaultGpuMemoryFraction = 0.9;

// What a backend is created with: the engine fills it from EngineConfig
// (engine.cc's BackendConfigFor); the defaults are EngineConfig's and the
// scheduler's.
struct BackendConfig {
  Device device = Device::kCpu;  // kAuto is resolved by the factory
  int32_t block_size = scheduler::SchedulerConfig{}.block_size;
  // KV budget in bytes; 0 means: CPU, kv_cache_fraction of physical memory;
  // CUDA, gpu_memory_fraction of device memory minus weights and
  // activations measured by a profiling forward.
  int64_t kv_cache_bytes = 0;
  double kv_cache_fraction = kDefaultKvCacheFraction;
  double gpu_memory_fraction = kDefaultGpuMemoryFraction;
  // Profiling forward size (CUDA).
  int32_t max_num_batched_tokens =
      scheduler::SchedulerConfig{}.max_num_batched_tokens;
  int32_t max_num_seqs = scheduler::SchedulerConfig{}.max_num_seqs;
  int64_t swap_space_bytes = 0;  // host swap space; 0 disables swapping
  // Pinned host KV cache for the tiers where the pool is in device memory
  // (--kv-host-cache-bytes; CUDA); its own memory, not the swap space's.
  int64_t host_cache_bytes = 0;
  // KV element type; nullopt: the backend's default (CPU int8 or fp16,
  // DefaultCpuKvDtype; CUDA bf16).
  // A dtype the backend cannot store is refused at creation.
  std::optional<kvcache::KvDtype> kv_dtype;
  SimConfig sim;  // Device::kSim only
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  virtual std::string_view device_name() const = 0;  // "cpu", "cuda:0"
  // Whether Forward honours ForwardBatch::sink_lens (a streaming kv_policy
  // with sinks); a backend that does not refuses such batches.
  [[nodiscard]] virtual bool ScoresKvSinks() const { return true; }
  // Whether Forward fills ForwardOutput::block_mass for ForwardBatch::
  // mass_seqs (a heavy_hitters kv_policy needs it).
  [[nodiscard]] virtual bool ReportsBlockMass() const { return false; }
  // kvcache::KvDtypeName of the stored KV: "fp16", "int8", "bf16", ...
  virtual kvcache::KvDtype kv_dtype() const = 0;
  virtual int32_t num_blocks() const = 0;
  virtual int32_t block_size() const = 0;
  // Bytes one block holds across all layers, K and V.
  virtual int64_t bytes_per_block() const = 0;
  virtual int32_t num_swap_slots() const = 0;  // host swap blocks
  // Measured or estimated cost model inputs for preemption mode choice:
  // seconds to recompute one token (prefill rate) and bytes/s host<->KV.
  virtual double seconds_per_prefill_token() const = 0;
  virtual double swap_bytes_per_second() const = 0;

  // Runs one step: writes the batch's K/V at slot_mapping and returns host
  // fp32 logits [batch.logits_rows.size(), vocab] row-major, and, where the
  // backend reduces them on the device, each row's argmax (then rows the
  // batch flags argmax_only are not copied to the host).
  [[nodiscard]] virtual absl::Status Forward(const models::ForwardBatch& batch,
                                             models::ForwardOutput* out) = 0;
  // Whole-block copies (copy-on-write): KV block src -> KV block dst.
  [[nodiscard]] virtual absl::Status CopyBlocks(
      absl::Span<const BlockMove> moves) = 0;
  // KV block src -> swap slot dst.
  [[nodiscard]] virtual absl::Status SwapOut(
      absl::Span<const BlockMove> moves) = 0;
  // Swap slot src -> KV block dst.
  [[nodiscard]] virtual absl::Status SwapIn(
      absl::Span<const BlockMove> moves) = 0;

  // KV tiers: block `block`'s bytes where the KV lives in host memory, in
  // the tier payload order (per layer its K then its V slab: a swap slot's
  // layout); empty where it does not (then the tiers are refused).
  [[nodiscard]] virtual std::vector<kvtier::Piece> KvBlockPieces(
      int32_t /*block*/) const {
    return {};
  }
  // What those bytes depend on besides the model and dtype: the kernels'
  // KV numerics version (bumped when a change alters stored KV bytes) and
  // the layout's name. Salted into every tier key.
  [[nodiscard]] virtual std::string kv_numerics_version() const { return ""; }
  [[nodiscard]] virtual std::string kv_layout_version() const { return ""; }
  // Where the KV is in device memory: its host cache and the copies to and
  // from it (null without --kv-host-cache-bytes, and on host backends).
  [[nodiscard]] virtual HostKvCopier* host_kv_copier() const { return nullptr; }
};

// Builds the backend for `config.device` ("auto": CUDA when the build has it
// and a device is present, else CPU). Takes what it needs from `model`
// (the packed CPU model, or the weights for a GPU upload). Errors name the
// flag: e.g. "--device=cuda: this build has no CUDA support".
[[nodiscard]] absl::StatusOr<std::unique_ptr<ModelBackend>> CreateBackend(
    const BackendConfig& config, LoadedModel* model);

// The device kAuto resolves to on this machine (kCuda or kCpu); any other
// value is returned as it is.
[[nodiscard]] Device ResolveDevice(Device requested);

// OK when the resolved `device` can run here; otherwise the error
// CreateBackend would give (FailedPrecondition "--device=cuda: no CUDA
// device is visible ..." or "... this build has no CUDA support ...").
// Cheap: lets callers fail before loading weights.
[[nodiscard]] absl::Status CheckDevice(Device device);

}  // namespace kvserve::engine
