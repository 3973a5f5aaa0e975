// The engine thread's side of n > 1 completions and of per-request
// bookkeeping at first scheduling. Completion i (0 = the parent) samples with
// seed + i. The parent computes the prompt once; after
// its prefill step each child samples its first token from the parent's raw
// prompt logits with its own random stream (exactly what an n = 1 request
// with that seed draws first) and is forked off the parent, sharing its
// blocks by ref count.
#include <algorithm>

#include "common/clock.h"
#include "engine/engine_impl.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

std::unique_ptr<LiveRequest> NewChild(const LiveRequest& parent, RequestId id,
                                      int32_t index) {
  auto c = std::make_unique<LiveRequest>();
  c->id = id;
  c->index = index;
  c->spec = parent.spec;
  c->spec.n = 1;
  c->spec.sampling.seed = parent.spec.sampling.seed + index;
  c->stream = parent.stream;
  c->arrival = parent.arrival;
  return c;
}

}  // namespace

void Engine::Impl::FirstScheduled(const scheduler::ScheduledRequest& s,
                                  absl::Time t0) {
  LiveRequest& r = *live_reqs_.at(s.id);
  const int32_t prompt = static_cast<int32_t>(r.spec.prompt_tokens.size());
  if (metrics_ && s.start_position < prompt) {
    metrics_->AddPromptTokensComputed(
        std::min(s.start_position + s.num_new_tokens, prompt) -
        s.start_position);
  }
  if (const scheduler::Request* req = scheduler_->GetRequest(s.id)) {
    r.num_preemptions = req->num_preemptions();
    r.kv_stats = req->kv_stats();
  }
  if (r.preempted_at != absl::InfinitePast()) {
    r.preempted_seconds += SecondsBetween(r.preempted_at, t0);
    r.preempted_at = absl::InfinitePast();
  }
  if (r.first_scheduled != absl::InfinitePast()) return;
  r.first_scheduled = t0;
  // Its table holds what its tier load brought in now.
  if (tiers_) tiers_->Release(s.id);
  ReleaseQueued(r);
  // Read now: a request finished by length is gone from the scheduler by
  // the time FinishRequest runs.
  if (const scheduler::Request* req = scheduler_->GetRequest(s.id)) {
    r.cached_prompt_tokens = req->num_cached_tokens();
  }
  if (metrics_) {
    metrics_->ObserveQueueTime(absl::ToDoubleSeconds(t0 - r.arrival));
    metrics_->AddPromptTokens(prompt);
  }
}

void Engine::Impl::ForkChildren(RequestId parent_id,
                                const std::vector<float>& parent_logits) {
  auto pit = live_reqs_.find(parent_id);
  if (pit == live_reqs_.end()) return;
  LiveRequest& p = *pit->second;
  const int32_t forks = p.pending_forks;
  p.pending_forks = 0;
  const absl::Time now = clock_->Now();
  for (int32_t i = 1; i <= forks; ++i) {
    auto c = NewChild(p, next_id_.fetch_add(1), i);
    c->first_scheduled = p.first_scheduled;
    c->cached_prompt_tokens = p.cached_prompt_tokens;
    c->output =
        std::make_unique<OutputProcessor>(c->spec, model_.tokenizer.get());
    const RequestId id = c->id;
    // Its grammar starts where the parent's did, at the prompt's end.
    const absl::Status added = runner_->AddRequest(
        id, c->spec.sampling, MinTokensStops(c->spec, *model_.tokenizer),
        c->spec.prompt_tokens, false, c->spec.grammar);
    SampleResult res;
    if (added.ok()) res = runner_->SampleForkedFirst(id, parent_logits);
    {
      absl::MutexLock lock(&mu_);
      ++live_;
    }
    LiveRequest& child = *c;
    AddLive(id, std::move(c));
    if (!added.ok()) {
      FinishRequest(id, FinishReason::kError, std::string(added.message()));
      continue;
    }
    // The child's KV is the parent's: it enters the scheduler only if it
    // goes on past this first token.
    auto req = std::make_unique<scheduler::Request>(
        id, child.spec.prompt_tokens, child.spec.max_tokens,
        child.spec.priority, absl::ToUnixNanos(child.arrival));
    req->set_cache_salt(child.spec.cache_salt);
    req->set_kv_window(child.spec.kv_window);
    req->set_output_token_ids({res.token});
    absl::Status st = absl::OkStatus();
    if (child.spec.max_tokens > 1) {
      st = scheduler_->Fork(parent_id, std::move(req));
    }
    if (metrics_) metrics_->AddGenerationTokens(1);
    if (!st.ok()) {
      spdlog::error("fork of request {} failed: {}", parent_id, st.ToString());
      FinishRequest(id, FinishReason::kError, std::string(st.message()));
      continue;
    }
    // One token is its whole budget: it never entered the scheduler.
    const bool one_token = child.spec.max_tokens <= 1;
    EmitToken(child, res, now, 0.0);  // its first token; finishes it on a stop
    if (one_token) FinishRequest(id, FinishReason::kLength);  // if still live
  }
  // Seats held for children that did not join (they ended on their first
  // token, or failed) go back.
  scheduler_->EndForks(parent_id);
}

void Engine::Impl::ReleaseQueued(LiveRequest& r) {
  if (r.queued_completions == 0) return;
  absl::MutexLock lock(&mu_);
  auto it = tenant_queued_.find(r.spec.tenant.name);
  if (it != tenant_queued_.end()) {
    it->second -= r.queued_completions;
    if (it->second <= 0) tenant_queued_.erase(it);
  }
  r.queued_completions = 0;
}

}  // namespace kvserve::engine
