#include "cli/sim_replay.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "engine/runner/platform.h"

namespace kvserve::cli {
namespace {

class Replayer {
 public:
  Replayer(const std::vector<TraceRequest>& trace, uint64_t seed,
           const std::vector<double>& step_starts)
      : trace_(trace), seed_(seed), starts_(step_starts) {
    result_.requests.resize(trace.size());
    streams_.resize(trace.size());
  }

  absl::StatusOr<ReplayResult> Run(engine::EngineConfig config,
                                   engine::LoadedModel model);

 private:
  // Engine thread, inside a simulated step of `step`: submits the arrivals
  // that fall inside it at their times, then moves the clock to its end.
  void OnStep(absl::Duration step);
  // Submits trace_[next_..] arriving by `until`; the streams are attached
  // by Attach, outside mu_ (an attached sink may run at once).
  std::vector<size_t> SubmitDue(absl::Time until, bool stop_clock_at_each)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Attach(const std::vector<size_t>& ids);
  void OnDelta(size_t i, const engine::StreamDelta& d);
  absl::Time ArrivalOf(size_t i) const {
    return start_ + absl::Seconds(trace_[i].arrival);
  }
  void OnStepRecord(const engine::StepRecord& r);
  // Real devices: submits each request at its arrival in real time.
  void FeedInRealTime();
  // The simulated device: submits arrivals while the engine is idle,
  // jumping the virtual clock to the next one.
  void FeedInVirtualTime();

  const std::vector<TraceRequest>& trace_;
  const uint64_t seed_;
  const std::vector<double>& starts_;  // a recorded timeline, or empty
  size_t step_k_ = 0;                  // engine thread only
  absl::Time start_ = absl::UnixEpoch();
  bool virtual_time_ = true;
  VirtualClock clock_{start_};
  std::unique_ptr<engine::Engine> engine_;
  int32_t vocab_ = 0;

  absl::Mutex mu_;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<engine::StreamState>> streams_;
  std::atomic<int64_t> submitted_{0}, finished_{0};
  std::atomic<int64_t> preemptions_{0}, cached_{0};
  // Each request's entry is written by its own sink only; samples by the
  // engine thread only. Read after the engine stopped.
  ReplayResult result_;
};

std::vector<size_t> Replayer::SubmitDue(absl::Time until,
                                        bool stop_clock_at_each) {
  std::vector<size_t> ids;
  for (; next_ < trace_.size() && ArrivalOf(next_) <= until; ++next_) {
    if (stop_clock_at_each) clock_.AdvanceTo(ArrivalOf(next_));
    engine::RequestSpec spec;
    spec.prompt_tokens = TracePrompt(trace_[next_], next_, seed_, vocab_);
    spec.max_tokens = trace_[next_].output_len;
    spec.sampling.temperature = 0;
    spec.ignore_eos = true;
    spec.detokenize = false;
    absl::StatusOr<std::shared_ptr<engine::StreamState>> st =
        engine_->Submit(std::move(spec));
    if (!st.ok()) {
      // The request is refused as a client would see it; the replay goes on.
      if (error_.ok()) error_ = st.status();
      continue;
    }
    streams_[next_] = *std::move(st);
    submitted_.fetch_add(1);
    ids.push_back(next_);
  }
  return ids;
}

void Replayer::Attach(const std::vector<size_t>& ids) {
  for (size_t i : ids) {
    engine::StreamState* raw = streams_[i].get();
    raw->Attach([this, i, raw](const engine::StreamDelta& d) {
      OnDelta(i, d);
      raw->Ack();
    });
  }
}

void Replayer::OnDelta(size_t i, const engine::StreamDelta& d) {
  ReplayedRequest& r = result_.requests[i];
  r.output_tokens += static_cast<int32_t>(d.token_ids.size());
  if (!d.finished) return;
  r.arrival = absl::ToDoubleSeconds(d.timings.arrival - start_);
  r.ttft = d.timings.time_to_first_token;
  r.e2e = d.timings.total_seconds;
  r.prompt_tokens = d.usage.prompt_tokens;
  r.cached_tokens = d.usage.cached_prompt_tokens;
  r.preemptions =
      d.usage.kv.preemptions_recompute + d.usage.kv.preemptions_swap;
  r.ok = d.finish_reason == engine::FinishReason::kLength;
  preemptions_.fetch_add(r.preemptions);
  cached_.fetch_add(r.cached_tokens);
  finished_.fetch_add(1);
}

void Replayer::OnStepRecord(const engine::StepRecord& rec) {
  result_.step_log.push_back(rec);
  result_.step_starts.push_back(absl::ToDoubleSeconds(rec.start - start_));
  const engine::EngineStats s = engine_->Stats();
  const absl::Time now = rec.start + absl::Seconds(rec.seconds);
  result_.samples.push_back({absl::ToDoubleSeconds(now - start_), s.running,
                             s.waiting, s.blocks_active, s.blocks_cached,
                             s.blocks_total, finished_.load(),
                             preemptions_.load(), cached_.load()});
}

void Replayer::OnStep(absl::Duration step) {
  // On a recorded timeline the step ends where the next one started, and
  // only arrivals before that start are in its inbox.
  const bool recorded = step_k_ + 1 < starts_.size();
  const absl::Time end = recorded ? start_ + absl::Seconds(starts_[step_k_ + 1])
                                  : clock_.Now() + step;
  ++step_k_;
  std::vector<size_t> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = SubmitDue(recorded ? end - absl::Nanoseconds(1) : end,
                    /*stop_clock_at_each=*/true);
  }
  clock_.AdvanceTo(end);
  Attach(ids);
}

void Replayer::FeedInVirtualTime() {
  while (true) {
    std::vector<size_t> ids;
    {
      absl::MutexLock lock(&mu_);
      const bool idle = finished_.load() == submitted_.load();
      if (idle && next_ == trace_.size()) return;
      // Idle: jump over the gap to the next arrival; what arrives together
      // reaches the engine in one inbox.
      if (idle) {
        engine_->Pause();
        ids = SubmitDue(std::max(clock_.Now(), ArrivalOf(next_)), true);
        engine_->Start();
      }
    }
    Attach(ids);
    if (ids.empty()) absl::SleepFor(absl::Microseconds(200));
  }
}

void Replayer::FeedInRealTime() {
  while (true) {
    std::vector<size_t> ids;
    {
      absl::MutexLock lock(&mu_);
      if (next_ == trace_.size()) break;
      const absl::Duration wait = ArrivalOf(next_) - absl::Now();
      if (wait <= absl::ZeroDuration()) {
        ids = SubmitDue(absl::Now(), /*stop_clock_at_each=*/false);
      }
    }
    Attach(ids);
    if (ids.empty()) absl::SleepFor(absl::Microseconds(200));
  }
  while (finished_.load() < submitted_.load()) {
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::StatusOr<ReplayResult> Replayer::Run(engine::EngineConfig config,
                                           engine::LoadedModel model) {
  vocab_ = model.config.vocab_size;
  virtual_time_ = engine::PlatformFor(config.device).simulated();
  engine::EngineOptions options;
  if (!virtual_time_) start_ = absl::Now();
  if (virtual_time_) {
    config.sim.step_sink = [this](absl::Duration step) { OnStep(step); };
    options.clock = &clock_;
    // A recorded timeline: the first step takes exactly the requests that
    // arrived before its recorded start.
    options.start_paused = !starts_.empty();
  }
  const bool timeline = options.start_paused;
  options.step_observer = [this](const engine::StepRecord& r) {
    OnStepRecord(r);
  };
  // A replay queues what the trace sends; nothing is refused for a full
  // queue (the engine's bound is for live clients).
  config.max_queued_requests = std::max<int32_t>(
      config.max_queued_requests, static_cast<int32_t>(trace_.size()) + 1);
  KV_ASSIGN_OR_RETURN(engine_,
                      engine::Engine::Create(config, std::move(model),
                                             std::move(options), nullptr));
  const absl::Time wall0 = absl::Now();
  if (timeline) {
    std::vector<size_t> ids;
    {
      absl::MutexLock lock(&mu_);
      ids = SubmitDue(start_ + absl::Seconds(starts_[0]) - absl::Nanoseconds(1),
                      /*stop_clock_at_each=*/true);
    }
    clock_.AdvanceTo(start_ + absl::Seconds(starts_[0]));
    Attach(ids);
    engine_->Start();
  }
  if (virtual_time_) {
    FeedInVirtualTime();
  } else {
    FeedInRealTime();
  }
  // The last request finishes inside its step, before that step's record:
  // stop the engine thread (with the engine still reachable from the
  // observer) before reading what it wrote.
  engine_->Stop();
  result_.wall_seconds = absl::ToDoubleSeconds(absl::Now() - wall0);
  result_.steps = engine_->Stats().steps;
  engine_.reset();
  double last = 0;
  for (const ReplayedRequest& r : result_.requests) {
    last = std::max(last, r.arrival + r.e2e);
  }
  result_.virtual_seconds = last - (trace_.empty() ? 0 : trace_[0].arrival);
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  return std::move(result_);
}

}  // namespace

absl::StatusOr<ReplayResult> ReplayTrace(
    engine::EngineConfig config, engine::LoadedModel model,
    const std::vector<TraceRequest>& trace, uint64_t seed,
    const std::vector<double>& step_starts) {
  Replayer replayer(trace, seed, step_starts);
  return replayer.Run(std::move(config), std::move(model));
}

}  // namespace kvserve::cli
