// Engine internals shared by engine.cc (set-up, submission) and
// engine_loop.cc (the engine thread). Not part of the public API.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/thread_owner.h"
#include "engine/engine.h"
#include "engine/engine_metrics.h"
#include "engine/kv_event_metrics.h"
#include "engine/kv_events.h"
#include "engine/kv_state.h"
#include "engine/kv_tiers.h"
#include "engine/live_request.h"
#include "engine/runner/draft_model.h"
#include "engine/runner/model_backend.h"
#include "engine/runner/model_runner.h"
#include "engine/tier_metrics.h"
#include "scheduler/scheduler.h"

namespace kvserve::engine {

class Engine::Impl {
 public:
  Impl(const EngineConfig& config, LoadedModel model,
       std::atomic<bool>* draining)
      : config_(config), model_(std::move(model)), draining_(draining) {}
  ~Impl() { Stop(); }

  // `backend` null: CreateBackend builds one from the config and the model.
  absl::Status Init(const std::shared_ptr<prometheus::Registry>& registry,
                    std::unique_ptr<ModelBackend> backend);
  // Before Init: the clock the engine reads (EngineOptions::clock).
  void set_clock(const Clock* clock) { clock_ = clock; }
  void set_step_observer(std::function<void(const StepRecord&)> f) {
    step_observer_ = std::move(f);
  }
  // Starts the engine thread; a `paused` one takes no request before
  // Resume() (or Stop, which cancels what was submitted).
  void Start(bool paused) {
    {
      absl::MutexLock lock(&mu_);
      paused_ = paused;
    }
    thread_ = std::thread([this] { Loop(); });
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    paused_ = false;
  }
  void Pause() {
    absl::MutexLock lock(&mu_);
    paused_ = true;
  }
  void Stop();

  absl::StatusOr<std::shared_ptr<StreamState>> Submit(RequestSpec spec);
  void Abort(RequestId id);
  void Drain(absl::Duration timeout);
  // Writes what the KV tiers have queued, up to `deadline`; the blocks
  // dropped. Any thread.
  absl::StatusOr<KvTierPurge> PurgeKvTiers(
      const std::optional<std::string>& cache_scope,
      const std::optional<std::string>& cache_salt) {
    if (!tiers_) {
      return absl::FailedPreconditionError(
          "no KV tiers: start with --kv-host-cache-bytes (cuda), "
          "--kv-disk-cache or --kv-remote-cache");
    }
    return tiers_->Purge(cache_scope, cache_salt);
  }
  int64_t FlushKvTiers(absl::Time deadline) {
    return tiers_ ? tiers_->Flush(deadline) : 0;
  }

  const ModelInfo& info() const { return info_; }
  // Null without a registry. Its counters are thread-safe.
  EngineMetrics* metrics() const { return metrics_.get(); }
  KvEventRelay* kv_events() const { return kv_events_.get(); }
  const LoadedModel& model() const { return model_; }
  // The latest snapshot (null before the engine thread built one); asks
  // for fresh ones for a while. Any thread; never waits for the loop.
  std::shared_ptr<const KvState> KvStateSnapshot() const;
  EngineStats Stats() const {
    absl::MutexLock lock(&stats_mu_);
    return stats_;
  }

 private:
  struct Inbox {
    std::vector<std::unique_ptr<LiveRequest>> adds;
    std::vector<RequestId> aborts;
  };

  absl::StatusOr<scheduler::SchedulerConfig> SchedulerConfigFor() const;
  absl::Status CheckSpec(const RequestSpec& spec) const;
  // A spec's kv_policy (streaming) against the model and the scheduler.
  absl::Status CheckKvWindow(const RequestSpec& spec) const;
  absl::Status CheckHeavyHitters(const RequestSpec& spec) const;
  void Loop();
  bool TakeInbox(Inbox* inbox);
  void Admit(std::unique_ptr<LiveRequest> r);
  // Requests whose tier load ended enter the scheduler.
  void AdmitLoaded();
  // One iteration of the engine loop: schedule, run the step on the model
  // runner, feed its tokens back to the scheduler, emit and finish.
  void Step();
  // Step's phases.
  void MarkPreempted(const std::vector<RequestId>& preempted, absl::Time t0);
  // A step that scheduled no tokens: its swaps only, then a short wait.
  void MoveBlocksOnly(const scheduler::SchedulerOutput& out);
  // The step's forks and sampled tokens to their requests.
  void Deliver(const scheduler::SchedulerOutput& out, StepResult& result);
  // Requests the scheduler ended this step (at max_tokens).
  void RetireFinished(const std::vector<scheduler::FinishedRequest>& finished);
  // Load and step stats, and the step observer.
  void EndStep(const scheduler::SchedulerOutput& out, const StepResult& result,
               absl::Time t0);
  // Adds a step's counter increments (the scheduler's, and the blocks the
  // runner swapped) to the metrics.
  void AddStepCounters(const scheduler::StepStats& s, int64_t swapped_out,
                       int64_t swapped_in);
  // Waits briefly for new input after a step that scheduled nothing.
  void WaitAfterEmptyStep();
  // Fails every request of `out` after a failed block move or forward.
  void FailStep(const scheduler::SchedulerOutput& out,
                const absl::Status& status);
  // Emits one sampled token of `r`; finishes it on a stop or at max_tokens.
  // `gap`: seconds since its previous token (a step's tokens share its
  // time).
  void EmitToken(LiveRequest& r, SampleResult& res, absl::Time now, double gap);
  // n > 1: samples each child's first token from the parent's raw prompt
  // `logits` and forks it off the parent in the scheduler.
  void ForkChildren(RequestId parent, const std::vector<float>& logits);
  void FirstScheduled(const scheduler::ScheduledRequest& s, absl::Time t0);
  // r's completions leave its tenant's queue count (first scheduled or
  // ended); idempotent.
  void ReleaseQueued(LiveRequest& r);
  // RESOURCE_EXHAUSTED when `spec` would overfill the queue or its
  // tenant's share of it; counts it otherwise.
  [[nodiscard]] absl::Status TakeQueueRoom(const RequestSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Emits each producer's sampled tokens in order (StepResult::counts),
  // and what its draft accepted; a stop ends it and drops the rest.
  void EmitTokens(const scheduler::SchedulerOutput& out, StepResult& result);
  // Speculative decoding: drafts for the running requests that decode next
  // (SpeculationControl decides), handed to the scheduler before Schedule.
  // A failed draft forward is logged and counted; the step goes on without
  // drafts.
  void ProposeDrafts();
  // Ends a live request for a reason of the engine's (a stop, cancel,
  // deadline, error): the scheduler ends it too, then CloseRequest.
  void FinishRequest(RequestId id, FinishReason reason,
                     const std::string& error = "");
  // Ends live request `id`, which the scheduler has ended (`record`: its
  // record then; null when it held none): flushes its output, finishes its
  // stream, counts it and forgets it.
  void CloseRequest(RequestId id, FinishReason reason,
                    const scheduler::FinishedRequest* record,
                    const std::string& error = "");
  // The KV part of r's final usage.
  [[nodiscard]] KvUsage KvUsageOf(const LiveRequest& r, double queued_seconds,
                                  absl::Time now) const;
  void ExpireDeadlines();
  // Adds a live request; one with a deadline also to deadlines_.
  void AddLive(RequestId id, std::unique_ptr<LiveRequest> r);
  // Ends an aborted request: a deadline if it is (almost) past, else a
  // client cancel.
  void FinishAborted(RequestId id);
  // Ends `r` at its deadline and counts it by phase.
  void FinishDeadline(RequestId id, const LiveRequest& r);
  void FailAll(const std::vector<RequestId>& ids, const std::string& error);
  void PublishStats(double step_seconds, int64_t tokens);
  void MaybeBuildKvState();
  // KvCacheManager::WrittenSlots of the live requests.
  [[nodiscard]] int64_t WrittenSlots() const;
  void PublishTokenSlots(const kvcache::KvUsage& kv);

  const EngineConfig config_;
  LoadedModel model_;
  const Clock* clock_ = &SystemClock::Get();
  std::function<void(const StepRecord&)> step_observer_;
  // When the engine thread last took the inbox (the start of its step);
  // engine thread only (stamped under mu_, like each request's arrival).
  absl::Time inbox_taken_;
  std::atomic<bool>* draining_;
  ModelInfo info_;
  std::unique_ptr<ModelRunner> runner_;
  // --speculative draft: the draft model (null otherwise).
  std::unique_ptr<DraftModel> draft_;
  // What a draft token costs (measured on the engine's own steps).
  SpeculationCost spec_cost_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  // With tiers and a registry; before tiers_, whose writer thread reports
  // to it, so it outlives that thread.
  std::unique_ptr<TierMetrics> tier_metrics_;
  // The KV tiers (null when off). After runner_: destroyed first, since its
  // loads write into the backend's KV.
  std::unique_ptr<KvTiers> tiers_;
  // KV cache events (null when off) and their metrics.
  std::unique_ptr<KvEventRelay> kv_events_;
  std::unique_ptr<KvEventMetrics> kv_event_metrics_;
  std::unique_ptr<EngineMetrics> metrics_;
  int32_t max_model_len_ = 0;

  // Inbox (any thread -> engine thread).
  mutable absl::Mutex mu_;
  Inbox inbox_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;  // submitted, not yet finished
  // Completions in the inbox or waiting (a request of n counts n).
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Per tenant: completions submitted and not yet first scheduled (their
  // tenant's max_queued bounds it).
  absl::flat_hash_map<std::string, int64_t> tenant_queued_ ABSL_GUARDED_BY(mu_);
  // Until Resume(), for an engine started paused.
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  // A tier load ended (set by a loader thread).
  bool tier_wake_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<RequestId> next_id_{1};

  // Engine thread only: Loop binds `loop_owner_`, and the methods that
  // touch live_reqs_ (Admit, ExpireDeadlines, Step, FinishRequest) check it.
  LiveRequestMap live_reqs_;
  // (deadline, id) of the live requests that have one, soonest first: a
  // step looks at the expired ones only, not at every live request.
  absl::btree_set<std::pair<absl::Time, RequestId>> deadlines_;
  ThreadOwner loop_owner_;

  absl::Time slots_published_ = absl::InfinitePast();
  absl::Time kv_state_built_ = absl::InfinitePast();
  mutable std::atomic<int64_t> kv_state_wanted_ns_{0};
  mutable absl::Mutex kv_state_mu_;
  std::shared_ptr<const KvState> kv_state_ ABSL_GUARDED_BY(kv_state_mu_);

  mutable absl::Mutex stats_mu_;
  EngineStats stats_ ABSL_GUARDED_BY(stats_mu_);
  std::thread thread_;
};

}  // namespace kvserve::engine
