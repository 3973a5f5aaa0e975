// Engine internals shared by engine.cc (set-up, submission) and
// engine_loop.cc (the engine thread). Not part of the public API.
#pragma once

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "engine/engine_metrics.h"
#include "engine/model_backend.h"
#include "engine/output_processor.h"
#include "models/forward_batch.h"
#include "scheduler/scheduler.h"

namespace kvserve::engine {

// One request as the engine thread sees it.
struct LiveRequest {
  RequestId id;
  RequestSpec spec;
  std::shared_ptr<StreamState> stream;
  std::unique_ptr<OutputProcessor> output;
  absl::Time arrival, first_scheduled = absl::InfinitePast(),
                      first_token = absl::InfinitePast(),
                      last_token = absl::InfinitePast();
  int32_t completion_tokens = 0;
  // Prompt tokens served from the prefix cache (read when first scheduled).
  int32_t cached_prompt_tokens = 0;
  // Completion index in the shared stream (n > 1), and children this
  // request (index 0) still has to fork once its prompt is computed.
  int32_t index = 0;
  int32_t pending_forks = 0;
  int32_t num_preemptions = 0;  // as of its latest scheduling
};

class Engine::Impl {
 public:
  Impl(const EngineConfig& config, LoadedModel model,
       std::atomic<bool>* draining)
      : config_(config), model_(std::move(model)), draining_(draining) {}
  ~Impl() { Stop(); }

  // `backend` null: CreateBackend builds one from the config and the model.
  absl::Status Init(const std::shared_ptr<prometheus::Registry>& registry,
                    std::unique_ptr<ModelBackend> backend);
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
  void Stop();

  absl::StatusOr<std::shared_ptr<StreamState>> Submit(RequestSpec spec);
  void Abort(RequestId id);
  void Drain(absl::Duration timeout);

  const ModelInfo& info() const { return info_; }
  const LoadedModel& model() const { return model_; }
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
  void Loop();
  bool TakeInbox(Inbox* inbox);
  void Admit(std::unique_ptr<LiveRequest> r);
  void Step();
  // Performs `out`'s block moves on the backend in the scheduler's order:
  // swap out, swap in, copy-on-write copies.
  [[nodiscard]] absl::Status RunBlockMoves(
      const scheduler::SchedulerOutput& out);
  models::ForwardBatch BuildBatch(const scheduler::SchedulerOutput& out,
                                  std::vector<int32_t>* logits_owner);
  // Whether `r`'s next token can come from the device argmax alone (then
  // the backend need not copy its logits row to the host).
  static bool NeedsOnlyArgmax(const LiveRequest& r);
  std::vector<SampleResult> SampleAll(const scheduler::SchedulerOutput& out,
                                      const std::vector<int32_t>& producers);
  // Emits one sampled token of `r`; finishes it on a stop or at max_tokens.
  void EmitToken(LiveRequest& r, SampleResult& res, absl::Time now);
  // n > 1: samples each child's first token from the parent's prompt
  // logits (fork_logits_) and forks it off the parent in the scheduler.
  void ForkChildren(RequestId parent);
  void FirstScheduled(const scheduler::ScheduledRequest& s, absl::Time t0);
  void EmitTokens(const scheduler::SchedulerOutput& out,
                  const std::vector<int32_t>& producers,
                  std::vector<SampleResult>& sampled);
  void FinishRequest(RequestId id, FinishReason reason,
                     const std::string& error = "");
  void ExpireDeadlines();
  // Ends an aborted request: a deadline if it is (almost) past, else a
  // client cancel.
  void FinishAborted(RequestId id);
  // Ends `r` at its deadline and counts it by phase.
  void FinishDeadline(RequestId id, const LiveRequest& r);
  void FailAll(const std::vector<RequestId>& ids, const std::string& error);
  void PublishStats(double step_seconds, int64_t tokens);

  const EngineConfig config_;
  LoadedModel model_;
  std::atomic<bool>* draining_;
  ModelInfo info_;
  std::unique_ptr<ModelBackend> backend_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<EngineMetrics> metrics_;
  int32_t max_model_len_ = 0;

  // Inbox (any thread -> engine thread).
  mutable absl::Mutex mu_;
  Inbox inbox_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;    // submitted, not yet finished
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // in inbox or waiting
  // Until Resume(), for an engine started paused.
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<RequestId> next_id_{1};

  // Engine thread only.
  absl::flat_hash_map<RequestId, std::unique_ptr<LiveRequest>> live_reqs_;
  models::ForwardOutput step_out_;  // the last forward's logits / argmax
  int64_t recomputed_tokens_seen_ = 0;
  int64_t prefix_queries_seen_ = 0, prefix_hits_seen_ = 0;
  int64_t preempt_recompute_seen_ = 0, preempt_swap_seen_ = 0;
  int64_t uncacheable_seen_ = 0;
  int64_t swapped_out_blocks_ = 0, swapped_in_blocks_ = 0;
  int64_t swapped_out_seen_ = 0, swapped_in_seen_ = 0;
  // Raw prompt logits of parents about to fork (n > 1), by parent id.
  absl::flat_hash_map<RequestId, std::vector<float>> fork_logits_;

  mutable absl::Mutex stats_mu_;
  EngineStats stats_ ABSL_GUARDED_BY(stats_mu_);
  std::thread thread_;
};

}  // namespace kvserve::engine
