// The serving engine: one thread (the engine loop) owns the scheduler, the
// KV manager, the KV storage, and the model; other threads talk to it only
// through Submit/Abort/Drain (an inbox) and read results through each
// request's StreamState. Each step: drain the inbox, schedule, run one
// batched forward (prefill chunks and decode tokens together), sample,
// stream out, retire finished requests.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "engine/request_spec.h"
#include "engine/runner/device.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/model_backend.h"
#include "engine/speculation.h"
#include "engine/stream_state.h"
#include "grammar/grammar_compiler.h"
#include "kvcache/kv_format.h"
#include "kvcache/kv_sizing.h"
#include "kvevents/publisher.h"
#include "models/forward_batch.h"
#include "scheduler/scheduler_config.h"

namespace prometheus {
class Registry;
}

namespace kvserve::engine {

struct KvState;

// The engine's configuration, typed and with the only defaults there are:
// the serve flags start from these values, and `scheduler` is the
// scheduler's own configuration with its defaults.
// KV tiers below the pool (engine/kv_tiers.h): off while disk_dir and
// remote_url are both empty.
struct KvTierConfig {
  // --kv-host-cache-bytes: pinned host slots under a device pool (CUDA).
  int64_t host_bytes = 0;
  std::string disk_dir;         // --kv-disk-cache
  int64_t disk_bytes = 0;       // --kv-disk-cache-bytes; 0: 10% of the disk
  std::string remote_url;       // --kv-remote-cache redis://HOST:PORT[/DB]
  std::string remote_user;      // --kv-remote-cache-user (ACL), or default
  std::string remote_password;  // from a file or KVSERVE_REDIS_PASSWORD
  absl::Duration remote_timeout = absl::Milliseconds(500);
  int64_t remote_ttl_seconds = 0;  // --kv-remote-cache-ttl; 0: none
  // --kv-tier-encryption-key-file: blocks sealed at rest (AES-256-GCM).
  std::string encryption_key_file;
  int32_t load_threads = 2;
  // A load may take this many times the predicted recompute (at least
  // min_load_deadline) before the request computes the rest itself.
  double load_deadline_factor = 2.0;
  absl::Duration min_load_deadline = absl::Milliseconds(20);
  // Fault injection (--kv-tier-inject-faults): every disk write or read
  // fails with this errno; 0: none.
  int32_t inject_write_errno = 0;
  int32_t inject_read_errno = 0;
};

// What a router could know of the pool (KvEventResidentBlocks): the
// findable full blocks of the namespace KV events announce, by wire hash.
struct ResidentBlocks {
  int32_t block_size = 0;
  std::vector<uint64_t> hashes;
  int64_t unannounced = 0;  // findable blocks of other namespaces
};

// What PurgeKvTiers deleted, per tier.
struct KvTierPurge {
  int64_t device_blocks = 0;  // unreferenced cached blocks of the pool
  int64_t host_blocks = 0;
  int64_t disk_blocks = 0;
  int64_t remote_blocks = 0;
};

struct EngineConfig {
  // Scheduling: block_size, max_num_seqs, max_num_batched_tokens,
  // watermark, policy, kv_reservation, enable_prefix_caching,
  // preemption_mode, thrash_preemption_limit, admission_high_watermark,
  // long_prefill_token_threshold. The engine fills the fields it owns:
  // num_blocks, max_model_len, max_queued_requests, model_id, swap slots
  // and the preemption cost model.
  scheduler::SchedulerConfig scheduler;
  int64_t kv_cache_bytes = 0;  // 0: derive from kv_cache_fraction
  // Of physical memory, when kv_cache_bytes == 0.
  double kv_cache_fraction = kDefaultKvCacheFraction;
  // Waiting requests before Submit answers RESOURCE_EXHAUSTED.
  int32_t max_queued_requests = 1024;
  int32_t max_model_len = 0;  // 0: the model's max context
  // The backend (engine/model_backend.h).
  Device device = Device::kCpu;
  SimConfig sim;  // Device::kSim: the GPU, ranks and pace it simulates
  double gpu_memory_fraction = kDefaultGpuMemoryFraction;
  // Host swap space for preemption by swap; 0 disables swapping.
  int64_t swap_space_bytes = 0;
  // KV element type (--kv-cache-dtype); nullopt: the backend's default.
  std::optional<kvcache::KvDtype> kv_cache_dtype;
  // Fault injection for tests (--fault-step-delay-ms): every engine step
  // sleeps this long before its forward, like a stalled device. Zero: off.
  absl::Duration fault_step_delay = absl::ZeroDuration();
  KvTierConfig kv_tiers;
  // KV cache events for routers (--kv-events-endpoint; empty: none).
  kvevents::PublisherOptions kv_events;
  // --kv-events-private-scopes: private scopes' blocks are announced under
  // "<this>@<scope>" (engine/kv_events.h); empty: not announced.
  std::string kv_events_private_scopes_model;
  // Checks the KV invariants after every step (always on in debug and
  // sanitizer builds; --kv-debug-invariants): a broken one aborts.
  bool debug_invariants = false;
  // Speculative decoding (--speculative, engine/speculation.h).
  SpeculativeConfig speculative;
  // Structured output's compile bounds (--structured-output-*).
  grammar::GrammarCompilerOptions structured_output;
  // --structured-output-overlap: grammar masks computed beside the forward
  // (engine/runner/mask_worker.h).
  bool structured_output_overlap = false;
};

// Static facts about the loaded model and cache, for GetModelInfo and logs.
struct ModelInfo {
  std::string name, path, format, architecture;
  int32_t num_layers = 0, hidden_size = 0, num_heads = 0, num_kv_heads = 0;
  int32_t head_dim = 0, intermediate_size = 0, vocab_size = 0;
  int32_t max_context = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t kv_bytes_per_block = 0;
  int32_t block_size = 0, num_blocks = 0;
  // Tokens one request can hold in the pool (its blocks less the
  // watermark): a prompt + max_tokens beyond it can never run.
  int64_t max_request_kv_tokens = 0;
  kvcache::KvDtype kv_dtype = kvcache::KvDtype::kBF16;
  std::string device;  // the backend's device name ("cpu", "cuda:0")
  // Device::kSim: no model ran; token ids are pseudo-random.
  bool simulated = false;
  int32_t num_swap_slots = 0;
};

// A consistent snapshot for metrics and readiness.
struct EngineStats {
  int32_t running = 0, waiting = 0;
  int32_t blocks_total = 0, blocks_free = 0, blocks_active = 0,
          blocks_cached = 0;
  int64_t reserved_slots = 0;  // token slots in running requests' blocks
  int64_t reserved_unwritten_slots = 0;  // allocated but not yet written
  int64_t steps = 0;
  absl::Time last_step_end = absl::InfinitePast();
};

// One engine step as it ran: a step profile is fitted to these
// (models/sim/step_profile.h).
struct StepRecord {
  int64_t step = 0;
  // When the step took the inbox: it admitted exactly the requests whose
  // arrival is earlier.
  absl::Time start;
  // start -> the step's bookkeeping done (the loop turn), engine clock
  double seconds = 0;
  double forward_seconds = 0;
  models::BatchLoad load;
};

// What Create takes besides the config and the model. The defaults are what
// the daemon runs; the rest lets tests drive the engine on a scripted backend.
struct EngineOptions {
  // The backend to run on; null: CreateBackend builds one for config.device
  // from the model's weights. A given backend must use config.block_size,
  // and the model then needs only its config and tokenizer (no weights).
  std::unique_ptr<ModelBackend> backend;
  // The engine thread takes no request before Start(): requests submitted
  // until then are admitted together, in submission order.
  bool start_paused = false;
  // What arrival, scheduling, token and finish times are read from; null:
  // the system clock. A trace replay passes its virtual clock (must outlive
  // the engine).
  const Clock* clock = nullptr;
  // Called on the engine thread after every step that ran a forward.
  std::function<void(const StepRecord&)> step_observer;
};

class Engine {
 public:
  // Sizes the KV storage from `config`, builds the scheduler, registers
  // metrics in `registry` (may be null), and starts the engine thread.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineConfig& config, LoadedModel model,
      std::shared_ptr<prometheus::Registry> registry);
  // The same, with `options`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineConfig& config, LoadedModel model, EngineOptions options,
      std::shared_ptr<prometheus::Registry> registry);
  ~Engine();  // Stop()

  // Stops the engine thread after its current step (and that step's
  // observer call) and joins it; unfinished requests finish as cancelled.
  // Idempotent. After it, Stats() is final.
  void Stop();

  // Thread-safe, never waits for the engine loop. The one check of the
  // spec's limits. Errors: INVALID_ARGUMENT naming the RequestSpec field
  // (empty prompt, n, token ids outside the vocabulary, max_tokens < 1, past
  // the context), OUT_OF_RANGE (can never fit the KV pool),
  // RESOURCE_EXHAUSTED (queue full), UNAVAILABLE (draining).
  [[nodiscard]] absl::StatusOr<std::shared_ptr<StreamState>> Submit(
      RequestSpec spec);
  // Cancels a request (no-op if already finished). Its blocks are freed
  // within one step and it finishes with kCancelled.
  void Abort(RequestId id);
  // Lets an engine created with start_paused, or held by Pause(), take
  // requests and step again; no-op otherwise.
  void Start();
  // Holds the engine thread before its next step (after the current one)
  // until Start(): what is submitted meanwhile is taken in one inbox, as if
  // it had arrived at once (a trace replay's simultaneous arrivals).
  void Pause();

  // Stops admitting (Submit returns UNAVAILABLE), lets in-flight requests
  // finish until `timeout`, cancels the rest. Returns when all are done.
  void Drain(absl::Duration timeout);
  // Writes what the KV tiers have queued until `deadline` (a shutdown's
  // drain budget); returns the blocks dropped. 0 without tiers.
  int64_t FlushKvTiers(absl::Time deadline);
  // The findable full blocks the KV events announce, by wire hash, as of
  // the engine's next iteration (engine/kv_events.h). FailedPrecondition
  // without --kv-events-endpoint.
  [[nodiscard]] absl::StatusOr<ResidentBlocks> KvEventResidentBlocks(
      absl::Duration timeout);
  // Deletes the KV tiers' blocks of one cache scope (nullopt: every
  // scope), and of one cache_salt within it (nullopt: any), from the disk
  // and the remote store. Thread-safe; the remote part waits on the store.
  // FailedPrecondition without tiers; the store's error when it fails.
  [[nodiscard]] absl::StatusOr<KvTierPurge> PurgeKvTiers(
      const std::optional<std::string>& cache_scope,
      const std::optional<std::string>& cache_salt);
  // Stops admitting at once (Submit returns UNAVAILABLE); Drain waits.
  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  const ModelInfo& model_info() const;
  const models::Tokenizer& tokenizer() const;
  // The loaded model's metadata and tokenizer; its `model` (the packed
  // weights) has moved into the backend and is null here.
  const LoadedModel& model() const;
  EngineStats Stats() const;
  // The KV cache as the engine thread last saw it (engine/kv_state.h), at
  // most ~200 ms old while it is read regularly; null until the engine
  // thread built the first one. Thread-safe; never waits.
  std::shared_ptr<const KvState> KvStateSnapshot() const;
  // Compiles a structured-output grammar for this model's vocabulary
  // (RequestSpec::grammar) within the compiler's bounds
  // (grammar/grammar_compiler.h), counted in /metrics; FAILED_PRECONDITION
  // when the model cannot be constrained (its tokenizer names no
  // end-of-generation token). Thread-safe; waits for the compile.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>>
  CompileGrammar(const grammar::GrammarSpec& spec) const;
  // Null when the model cannot be constrained.
  const grammar::GrammarCompiler* grammar_compiler() const {
    return grammar_compiler_.get();
  }

 private:
  class Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<grammar::GrammarCompiler> grammar_compiler_;
  std::atomic<bool> draining_{false};
};

}  // namespace kvserve::engine
