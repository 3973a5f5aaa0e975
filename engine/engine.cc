#include "engine/engine.h"

#include <algorithm>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/field_error.h"
#include "common/status_macros.h"
#include "engine/engine_impl.h"
#include "engine/engine_metrics.h"
#include "engine/output_processor.h"
#include "engine/runner/model_backend.h"
#include "engine/runner/platform.h"
#include "kvcache/kv_sizing.h"
#include "models/forward_batch.h"
#include "scheduler/scheduler.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

BackendConfig BackendConfigFor(const EngineConfig& config) {
  BackendConfig bc;
  bc.device = config.device;
  bc.block_size = config.scheduler.block_size;
  bc.kv_cache_bytes = config.kv_cache_bytes;
  bc.kv_cache_fraction = config.kv_cache_fraction;
  bc.gpu_memory_fraction = config.gpu_memory_fraction;
  bc.max_num_batched_tokens = config.scheduler.max_num_batched_tokens;
  bc.max_num_seqs = config.scheduler.max_num_seqs;
  bc.swap_space_bytes = config.swap_space_bytes;
  bc.host_cache_bytes = config.kv_tiers.host_bytes;
  bc.kv_dtype = config.kv_cache_dtype;
  bc.sim = config.sim;
  return bc;
}

}  // namespace

absl::StatusOr<scheduler::SchedulerConfig> Engine::Impl::SchedulerConfigFor()
    const {
  scheduler::SchedulerConfig sc = config_.scheduler;
  const ModelBackend& backend_ref = runner_->backend();
  sc.num_blocks = backend_ref.num_blocks();
  // The engine bounds the queue itself (Submit answers without the loop);
  // the scheduler's bound only backs it up.
  sc.max_queued_requests = std::max(config_.max_queued_requests, 1) * 2 + 64;
  sc.max_model_len = max_model_len_;
  // Cached KV is only valid for the weights that computed it: with tiers,
  // whose blocks outlive the process, the weights' content and the KV
  // format (kvtier/block_key.h); else the file.
  sc.model_id = tiers_ ? tiers_->model_id() : model_.path;
  // Preemption cost model: recompute = tokens x seconds per prefill token;
  // swap = block bytes / copy bandwidth, one way (the scheduler counts
  // out and back in).
  const double swap_block_seconds =
      backend_ref.bytes_per_block() /
      std::max(backend_ref.swap_bytes_per_second(), 1.0);
  sc.num_swap_slots = backend_ref.num_swap_slots();
  sc.recompute_seconds_per_token = backend_ref.seconds_per_prefill_token();
  sc.swap_seconds_per_block = swap_block_seconds;
  return sc;
}

absl::Status Engine::Impl::Init(
    const std::shared_ptr<prometheus::Registry>& registry,
    std::unique_ptr<ModelBackend> backend) {
  const models::ModelConfig& c = model_.config;
  // Positions past the trained context (times --rope-scale, applied by the
  // loader) would run with RoPE angles the model never saw: refused, as vLLM
  // does, not clamped behind the user's back.
  if (config_.max_model_len > c.max_position) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max-model-len %d exceeds the model's context of %d tokens "
        "(max_position_embeddings)",
        config_.max_model_len, c.max_position));
  }
  max_model_len_ =
      config_.max_model_len > 0 ? config_.max_model_len : c.max_position;
  if (backend == nullptr) {
    KV_ASSIGN_OR_RETURN(backend,
                        CreateBackend(BackendConfigFor(config_), &model_));
  } else if (backend->block_size() != config_.scheduler.block_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "Engine::Create: the backend's block size %d is not the config's %d",
        backend->block_size(), config_.scheduler.block_size));
  }
  runner_ = std::make_unique<ModelRunner>(
      std::move(backend), config_.scheduler.block_size, c.vocab_size,
      config_.fault_step_delay, clock_);
  runner_->set_overlap_masks(config_.structured_output_overlap);
  if (config_.fault_step_delay > absl::ZeroDuration()) {
    spdlog::warn(
        "fault injection: every engine step sleeps {} ms "
        "(--fault-step-delay-ms; for tests only)",
        absl::ToInt64Milliseconds(config_.fault_step_delay));
  }
  const ModelBackend& backend_ref = runner_->backend();
  if (config_.speculative.mode != SpeculativeMode::kOff &&
      backend_ref.device_name().starts_with("cuda")) {
    // Its logits buffers hold one row per sequence; a draft needs more.
    return absl::InvalidArgumentError(
        "--speculative: not built for the cuda backend yet; use --device cpu");
  }
  if (config_.speculative.mode == SpeculativeMode::kDraft) {
    DraftModelConfig dc;
    dc.path = config_.speculative.draft_model;
    // Room for the sequences drafted for at once and as many again, so
    // that one leaving the batch for a while keeps its draft KV.
    dc.max_seqs = std::clamp(2 * config_.speculative.max_decode_batch, 2, 16);
    dc.max_model_len = max_model_len_;
    dc.p_min = config_.speculative.draft_p_min;
    KV_ASSIGN_OR_RETURN(draft_, DraftModel::Create(dc, *model_.tokenizer));
    spdlog::info("speculative decoding: draft model {}", draft_->path());
  }
  if (config_.kv_tiers.host_bytes > 0 || !config_.kv_tiers.disk_dir.empty() ||
      !config_.kv_tiers.remote_url.empty()) {
    if (registry) {
      tier_metrics_ = std::make_unique<TierMetrics>(
          *registry, backend_ref.host_kv_copier() != nullptr,
          !config_.kv_tiers.disk_dir.empty(),
          !config_.kv_tiers.remote_url.empty());
    }
    KV_ASSIGN_OR_RETURN(tiers_, KvTiers::Create(
                                    config_.kv_tiers, model_, backend_ref,
                                    [this] {
                                      absl::MutexLock lock(&mu_);
                                      tier_wake_ = true;
                                    },
                                    tier_metrics_.get()));
  }
  const int32_t num_blocks = backend_ref.num_blocks();
  const int64_t per_token =
      backend_ref.bytes_per_block() / config_.scheduler.block_size;
  KV_ASSIGN_OR_RETURN(scheduler::SchedulerConfig sc, SchedulerConfigFor());
  KV_ASSIGN_OR_RETURN(scheduler_, scheduler::Scheduler::Create(sc));
  if (tiers_) tiers_->Attach(scheduler_.get());
  if (!config_.kv_events.endpoint.empty()) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<kvevents::Publisher> publisher,
                        kvevents::Publisher::Create(config_.kv_events));
    kv_events_ = std::make_unique<KvEventRelay>(
        std::move(publisher), sc.block_size, sc.model_id,
        config_.kv_events_private_scopes_model);
    kv_events_->Attach(&scheduler_->kv_cache_for_tiers());
    if (tiers_) kv_events_->AttachTiers(tiers_.get());
    if (registry) {
      kv_event_metrics_ = std::make_unique<KvEventMetrics>(*registry);
    }
    spdlog::info("kv events: publishing on {} ({}), topic '{}'{}",
                 config_.kv_events.endpoint,
                 kvevents::Publisher::Binds(config_.kv_events.endpoint)
                     ? "bound"
                     : "connected",
                 config_.kv_events.topic,
                 config_.kv_events.replay_endpoint.empty()
                     ? ""
                     : ", replay on " + config_.kv_events.replay_endpoint);
  }

  info_.name = c.name;
  info_.path = model_.path;
  info_.format = model_.format;
  info_.architecture = c.architecture;
  info_.num_layers = c.num_layers;
  info_.hidden_size = c.hidden_size;
  info_.num_heads = c.num_heads;
  info_.num_kv_heads = c.num_kv_heads;
  info_.head_dim = c.head_dim;
  info_.intermediate_size = c.intermediate_size;
  info_.vocab_size = c.vocab_size;
  info_.max_context = max_model_len_;
  info_.kv_bytes_per_token = per_token;
  info_.kv_bytes_per_block = backend_ref.bytes_per_block();
  info_.block_size = config_.scheduler.block_size;
  info_.num_blocks = num_blocks;
  info_.max_request_kv_tokens =
      (int64_t{num_blocks} - sc.watermark_blocks()) * sc.block_size;
  info_.kv_dtype = backend_ref.kv_dtype();
  info_.device = std::string(backend_ref.device_name());
  info_.simulated = PlatformFor(config_.device).simulated();
  info_.num_swap_slots = backend_ref.num_swap_slots();
  const int64_t tokens =
      static_cast<int64_t>(num_blocks) * config_.scheduler.block_size;
  spdlog::info(
      "kv cache on {}: {} bytes/token ({}), {} blocks of {} tokens = {} "
      "tokens, {:.1f} MiB; holds {} sequences at max context {}; swap space "
      "{} blocks ({:.1f} MiB); cost model: {:.3g} ms/prefill token, {:.3g} "
      "GB/s swap",
      info_.device, per_token, kvcache::KvDtypeName(info_.kv_dtype), num_blocks,
      config_.scheduler.block_size, tokens,
      num_blocks * backend_ref.bytes_per_block() / 1048576.0,
      tokens / std::max<int64_t>(
                   1, (max_model_len_ + config_.scheduler.block_size - 1) /
                          config_.scheduler.block_size *
                          config_.scheduler.block_size),
      max_model_len_, info_.num_swap_slots,
      info_.num_swap_slots * backend_ref.bytes_per_block() / 1048576.0,
      backend_ref.seconds_per_prefill_token() * 1e3,
      backend_ref.swap_bytes_per_second() / 1e9);
  if (info_.max_request_kv_tokens < max_model_len_) {
    // Not refused: a small pool still serves short requests; an unset chat
    // max_tokens defaults to what the pool holds (request_validation.h).
    spdlog::warn(
        "the KV pool holds {} tokens per request, less than one context of "
        "{}: longer requests are refused, chat without max_tokens is capped "
        "to the pool (raise --kv-cache-bytes or lower --max-model-len)",
        info_.max_request_kv_tokens, max_model_len_);
  }
  if (registry) {
    metrics_ = std::make_unique<EngineMetrics>(
        *registry,
        CacheConfigInfo{config_.scheduler.block_size, num_blocks, per_token,
                        info_.kv_dtype, backend_ref.num_swap_slots(),
                        backend_ref.bytes_per_block(), info_.device,
                        info_.simulated,
                        config_.scheduler.enable_prefix_caching});
    scheduler_->SetEvictionObserver(
        [metrics = metrics_.get()](const kvcache::Eviction& e) {
          metrics->ObserveEviction(e);
        });
  }
  PublishStats(0, 0);
  MaybeBuildKvState();  // readers find a snapshot from the start
  return absl::OkStatus();
}

void Engine::Impl::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

// The one check of a spec's limits; its field errors (common/field_error.h)
// name RequestSpec paths, which each front end renders in its own names.
absl::Status Engine::Impl::CheckSpec(const RequestSpec& spec) const {
  KV_RETURN_IF_ERROR(CheckRequestSpec(spec, info_.vocab_size));
  // The scheduler's config is immutable after creation: safe to read here.
  const scheduler::SchedulerConfig& sc = scheduler_->config();
  // Every completion runs as its own sequence: they must fit at once.
  if (spec.n > sc.max_num_seqs) {
    return InvalidFieldError(
        "n", absl::StrFormat("%d completions, over the server's limit of %d "
                             "sequences (--max-num-seqs)",
                             spec.n, sc.max_num_seqs));
  }
  if (spec.tenant.max_running > 0 && spec.n > spec.tenant.max_running) {
    return InvalidFieldError(
        "n",
        absl::StrFormat("%d completions, over tenant '%s''s limit of %d "
                        "running sequences (max_running)",
                        spec.n, spec.tenant.name, spec.tenant.max_running));
  }
  if (spec.kv_window.enabled()) KV_RETURN_IF_ERROR(CheckKvWindow(spec));
  return sc.CheckRequestSize(static_cast<int64_t>(spec.prompt_tokens.size()),
                             spec.max_tokens, spec.kv_window.enabled());
}

// A streaming kv_policy the engine can honour: the model attends to every
// earlier token (its own sliding window would already bound the KV, with
// other semantics), the window fits the scheduler's limits, and the backend
// scores sinks at their in-cache distance when there are sinks. No limit
// on the request's length: every query-key distance is one within the held
// KV (ForwardBatch::sink_lens), which the window keeps below max_model_len,
// itself within the trained context.
absl::Status Engine::Impl::CheckKvWindow(const RequestSpec& spec) const {
  const models::ModelConfig& c = model_.config;
  if (c.sliding_window > 0) {
    return InvalidFieldError(
        "kv_policy.type",
        absl::StrFormat("streaming is not available for this model: it "
                        "attends through its own sliding window of %d tokens",
                        c.sliding_window));
  }
  const scheduler::SchedulerConfig& sc = scheduler_->config();
  const scheduler::KvWindow& w = spec.kv_window;
  KV_RETURN_IF_ERROR(sc.CheckKvWindow(w.sinks, w.window, w.budget));
  const ModelBackend& backend = runner_->backend();
  if (w.heavy_hitters()) return CheckHeavyHitters(spec);
  if (w.sinks > 0 && !backend.ScoresKvSinks()) {
    return InvalidFieldError(
        "kv_policy.sinks",
        absl::StrFormat("the %s backend does not score sinks at their "
                        "in-cache positions; use sinks 0 there",
                        backend.device_name()));
  }
  return absl::OkStatus();
}

// Heavy hitters: the backend reports attention mass per block, and the
// positions stay within the trained context, since with blocks dropped
// anywhere the kept keys keep the positions they were written at (no one
// query rotation puts them all at their distance within the cache).
absl::Status Engine::Impl::CheckHeavyHitters(const RequestSpec& spec) const {
  const ModelBackend& backend = runner_->backend();
  if (!backend.ReportsBlockMass()) {
    return InvalidFieldError(
        "kv_policy.type",
        absl::StrFormat("heavy_hitters needs the attention mass per block, "
                        "which the %s backend does not report",
                        backend.device_name()));
  }
  const models::ModelConfig& c = model_.config;
  const int64_t last =
      static_cast<int64_t>(spec.prompt_tokens.size()) + spec.max_tokens;
  if (last > c.max_position) {
    return InvalidFieldError(
        "max_tokens",
        absl::StrFormat("prompt (%d tokens) + max_tokens (%d) passes the "
                        "model's trained context of %d positions; "
                        "heavy_hitters keeps the positions tokens were "
                        "written at (streaming does not need this)",
                        spec.prompt_tokens.size(), spec.max_tokens,
                        c.max_position));
  }
  return absl::OkStatus();
}

absl::Status Engine::Impl::TakeQueueRoom(const RequestSpec& spec) {
  if (queued_ + spec.n > config_.max_queued_requests) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "queue full: %d completions waiting, %d more would pass "
        "--max-queued-requests (%d)",
        queued_, spec.n, config_.max_queued_requests));
  }
  int64_t& mine = tenant_queued_[spec.tenant.name];
  if (spec.tenant.max_queued > 0 && mine + spec.n > spec.tenant.max_queued) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tenant '%s' has %d completions waiting; %d more would pass its "
        "max_queued (%d)",
        spec.tenant.name, mine, spec.n, spec.tenant.max_queued));
  }
  mine += spec.n;
  queued_ += spec.n;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<StreamState>> Engine::Impl::Submit(
    RequestSpec spec) {
  absl::Status s = CheckSpec(spec);
  const std::string tenant = spec.tenant.name;  // spec moves on success
  if (s.ok() && draining_->load()) {
    s = absl::UnavailableError("server is draining; not accepting requests");
  }
  auto r = std::make_unique<LiveRequest>();
  r->id = next_id_.fetch_add(1);
  r->arrival = clock_->Now();
  r->stream = std::make_shared<StreamState>(r->id, s.ok() ? spec.n : 1);
  auto stream = r->stream;
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      s = absl::UnavailableError("engine stopped");
    } else if (s = TakeQueueRoom(spec); s.ok()) {
      // Stamped under the inbox lock, as TakeInbox stamps the step start:
      // a request arrived before a step's start iff that step admits it.
      r->arrival = clock_->Now();
      r->queued_completions = spec.n;
      r->spec = std::move(spec);
      inbox_.adds.push_back(std::move(r));
      ++live_;
    }
  }
  if (!s.ok()) {
    if (metrics_) {
      metrics_->Rejected();
      metrics_->TenantRejected(tenant);
    }
    return s;
  }
  return stream;
}

void Engine::Impl::Abort(RequestId id) {
  absl::MutexLock lock(&mu_);
  inbox_.aborts.push_back(id);
}

void Engine::Impl::Drain(absl::Duration timeout) {
  draining_->store(true);
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return live_ == 0; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&idle), deadline)) {
    spdlog::warn(
        "drain: {} requests still running after the timeout; "
        "cancelling them",
        live_);
    stop_ = true;  // the loop cancels what is left and exits
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(10));
  }
}

// ---- Engine (public facade) ----

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() { impl_->Stop(); }
void Engine::Stop() { impl_->Stop(); }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineConfig& config, LoadedModel model,
    std::shared_ptr<prometheus::Registry> registry) {
  return Create(config, std::move(model), EngineOptions{}, std::move(registry));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineConfig& config, LoadedModel model, EngineOptions options,
    std::shared_ptr<prometheus::Registry> registry) {
  // Either form of the weights: the packed CPU model (LoadModel for "cpu")
  // or the raw weights kept for a GPU upload (LoadModel for "cuda").
  // CreateBackend says clearly when the form does not suit the device. A
  // given backend holds its own.
  // The simulated device needs the config and tokenizer alone.
  if (model.tokenizer == nullptr ||
      (options.backend == nullptr && !PlatformFor(config.device).simulated() &&
       model.model == nullptr && model.weights == nullptr)) {
    return absl::InvalidArgumentError(
        "Engine::Create: model not loaded (no tokenizer, or neither a packed "
        "CPU model nor kept weights)");
  }
  std::unique_ptr<Engine> engine(new Engine(nullptr));
  engine->impl_ =
      std::make_unique<Impl>(config, std::move(model), &engine->draining_);
  if (options.clock != nullptr) engine->impl_->set_clock(options.clock);
  engine->impl_->set_step_observer(std::move(options.step_observer));
  KV_RETURN_IF_ERROR(engine->impl_->Init(registry, std::move(options.backend)));
  absl::StatusOr<std::unique_ptr<grammar::GrammarCompiler>> grammar =
      grammar::GrammarCompiler::Create(*engine->impl_->model().tokenizer,
                                       engine->impl_->info().vocab_size,
                                       config.structured_output);
  if (grammar.ok()) {
    engine->grammar_compiler_ = *std::move(grammar);
  } else {
    spdlog::warn("structured output is off for this model: {}",
                 grammar.status().ToString());
  }
  engine->impl_->Start(options.start_paused);
  return engine;
}

absl::StatusOr<std::shared_ptr<StreamState>> Engine::Submit(RequestSpec spec) {
  return impl_->Submit(std::move(spec));
}
void Engine::Abort(RequestId id) { impl_->Abort(id); }
void Engine::Start() { impl_->Resume(); }
void Engine::Pause() { impl_->Pause(); }
void Engine::Drain(absl::Duration timeout) { impl_->Drain(timeout); }
int64_t Engine::FlushKvTiers(absl::Time deadline) {
  return impl_->FlushKvTiers(deadline);
}

absl::StatusOr<ResidentBlocks> Engine::KvEventResidentBlocks(
    absl::Duration timeout) {
  if (!impl_->kv_events()) {
    return absl::FailedPreconditionError(
        "no KV events: start with --kv-events-endpoint");
  }
  return impl_->kv_events()->ResidentHashes(timeout);
}

absl::StatusOr<KvTierPurge> Engine::PurgeKvTiers(
    const std::optional<std::string>& cache_scope,
    const std::optional<std::string>& cache_salt) {
  return impl_->PurgeKvTiers(cache_scope, cache_salt);
}
absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>>
Engine::CompileGrammar(const grammar::GrammarSpec& spec) const {
  if (grammar_compiler_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(spec.field,
                     ": structured output is off for this model "
                     "(its tokenizer names no end-of-generation "
                     "token)"));
  }
  auto compiled = grammar_compiler_->Compile(spec);
  if (EngineMetrics* m = impl_->metrics(); m != nullptr) {
    m->SetGrammarCompiles(grammar_compiler_->stats());
  }
  return compiled;
}

const ModelInfo& Engine::model_info() const { return impl_->info(); }
const models::Tokenizer& Engine::tokenizer() const {
  return *impl_->model().tokenizer;
}
const LoadedModel& Engine::model() const { return impl_->model(); }
EngineStats Engine::Stats() const { return impl_->Stats(); }
std::shared_ptr<const KvState> Engine::KvStateSnapshot() const {
  return impl_->KvStateSnapshot();
}

}  // namespace kvserve::engine
