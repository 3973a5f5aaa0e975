// The engine thread: drains the inbox, schedules, runs one batched forward,
// samples, streams output, retires finished requests. Everything here runs
// on that one thread except where a comment says otherwise.
#include <pthread.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "engine/engine_impl.h"
#include "kvcache/kv_format.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

// Idle wait for new work; bounded so deadlines are checked while idle.
constexpr absl::Duration kIdleWait = absl::Milliseconds(50);

}  // namespace

bool Engine::Impl::TakeInbox(Inbox* inbox) {
  absl::MutexLock lock(&mu_);
  auto has_input = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stop_ || (!paused_ && (!inbox_.adds.empty() ||
                                  !inbox_.aborts.empty() || tier_wake_));
  };
  if (!scheduler_->has_work()) {
    // Host cache copies are polled: soon, while one is in flight.
    const bool copying = tiers_ && tiers_->copies_in_flight();
    mu_.AwaitWithTimeout(absl::Condition(&has_input),
                         copying ? absl::Milliseconds(1) : kIdleWait);
  }
  // A paused engine (start_paused, Pause) takes nothing until released,
  // however it woke.
  auto released = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !paused_ || stop_;
  };
  mu_.Await(absl::Condition(&released));
  inbox_taken_ = clock_->Now();
  tier_wake_ = false;
  std::swap(*inbox, inbox_);
  return !stop_;
}

void Engine::Impl::Admit(std::unique_ptr<LiveRequest> r) {
  loop_owner_.CheckOwner("Engine::Impl::Admit");
  r->output =
      std::make_unique<OutputProcessor>(r->spec, model_.tokenizer.get());
  auto req = std::make_unique<scheduler::Request>(
      r->id, r->spec.prompt_tokens, r->spec.max_tokens, r->spec.priority,
      absl::ToUnixNanos(r->arrival));
  req->set_cache_salt(r->spec.cache_salt);
  req->set_kv_window(r->spec.kv_window);
  const RequestTenant& t = r->spec.tenant;
  req->set_cache_scope(t.cache_scope, t.scope_shared);
  if (kv_events_) {
    kv_events_->NoteRequest(t.cache_scope, t.scope_shared, r->spec.cache_salt);
  }
  req->set_tenant({t.name, t.weight, t.max_running});
  req->set_num_completions(r->spec.n);
  const RequestId id = r->id;
  // n > 1: the other completions fork off this one after its prefill.
  r->pending_forks = r->spec.n - 1;
  absl::Status added = runner_->AddRequest(
      id, r->spec.sampling, MinTokensStops(r->spec, *model_.tokenizer),
      r->spec.prompt_tokens, r->pending_forks > 0, r->spec.grammar);
  AddLive(id, std::move(r));
  if (!added.ok()) {
    FinishRequest(id, FinishReason::kError, std::string(added.message()));
    return;
  }
  // A prompt the KV tiers hold waits for its load (AdmitLoaded).
  if (tiers_ && tiers_->MaybeLoad(req, clock_->Now())) return;
  absl::Status s = scheduler_->AddRequest(std::move(req));
  if (!s.ok())
    FinishRequest(id, FinishReason::kError, std::string(s.message()));
}

void Engine::Impl::AdmitLoaded() {
  if (!tiers_) return;
  tiers_->ReleaseStale(absl::Now());
  for (KvTiers::Ready& ready : tiers_->TakeReady()) {
    auto it = live_reqs_.find(ready.id);
    if (it == live_reqs_.end()) continue;  // ended while loading
    it->second->host_prompt_tokens = ready.host_tokens;
    it->second->disk_prompt_tokens = ready.disk_tokens;
    it->second->remote_prompt_tokens = ready.remote_tokens;
    if (tier_metrics_) tier_metrics_->ObserveLoad(ready.load_seconds);
    absl::Status s = scheduler_->AddRequest(std::move(ready.request));
    if (!s.ok()) {
      FinishRequest(ready.id, FinishReason::kError, std::string(s.message()));
    }
  }
}

void Engine::Impl::Loop() {
  // Named for top -H, perf and the benchmarks that read its CPU time.
  pthread_setname_np(pthread_self(), "kv-engine");
  Inbox inbox;
  // Built on the creating thread, used from here on on this one only.
  scheduler_->BindOwnerThread();
  runner_->BindOwnerThread();
  loop_owner_.Rebind();
  // TakeInbox holds a paused engine (start_paused, Pause) until released.
  while (TakeInbox(&inbox)) {
    for (auto& r : inbox.adds) Admit(std::move(r));
    AdmitLoaded();
    // Before the aborts: gRPC also cancels a call whose deadline passed,
    // and that is a deadline, not a client cancel.
    ExpireDeadlines();
    for (RequestId id : inbox.aborts) {
      // `id` names a stream: its n > 1 completions all end.
      std::vector<RequestId> group;
      for (const auto& [rid, r] : live_reqs_) {
        if (r->stream->id() == id) group.push_back(rid);
      }
      for (RequestId rid : group) FinishAborted(rid);
    }
    inbox = Inbox{};
    if (scheduler_->has_work()) {
      Step();
    } else {
      PublishStats(0, 0);  // finishes outside a step still show in metrics
    }
    MaybeBuildKvState();
    if (kv_events_) kv_events_->Relay();
  }
  // Stopping: cancel what is left (queued in the inbox or live).
  {
    absl::MutexLock lock(&mu_);
    std::swap(inbox, inbox_);
  }
  for (auto& r : inbox.adds) Admit(std::move(r));
  std::vector<RequestId> ids;
  for (const auto& [id, r] : live_reqs_) ids.push_back(id);
  for (RequestId id : ids) FinishRequest(id, FinishReason::kCancelled);
  // Loads write into the pool: joined before the backend can go.
  if (tiers_) tiers_->Stop();
  PublishStats(0, 0);
}

void Engine::Impl::ExpireDeadlines() {
  loop_owner_.CheckOwner("Engine::Impl::ExpireDeadlines");
  const absl::Time now = clock_->Now();
  std::vector<RequestId> expired;
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now;
       ++it) {
    expired.push_back(it->second);
  }
  for (RequestId id : expired) {
    auto it = live_reqs_.find(id);
    if (it == live_reqs_.end()) continue;  // ended with a sibling
    FinishDeadline(id, *it->second);
  }
}

void Engine::Impl::AddLive(RequestId id, std::unique_ptr<LiveRequest> r) {
  if (r->spec.deadline.has_value()) deadlines_.insert({*r->spec.deadline, id});
  live_reqs_[id] = std::move(r);
}

void Engine::Impl::FinishDeadline(RequestId id, const LiveRequest& r) {
  // "running" once scheduled (it consumed prefill), even if preempted
  // since; "queued" requests never reached the model.
  if (metrics_) {
    metrics_->DeadlineExceeded(r.first_scheduled != absl::InfinitePast());
  }
  FinishRequest(id, FinishReason::kDeadline);
}

// A cancel that arrives just before the deadline is the client's own
// deadline timer (it starts before the server's, which counts from when the
// call arrived): it ends as a deadline, not a client cancel.
void Engine::Impl::FinishAborted(RequestId id) {
  constexpr absl::Duration kClientDeadlineSlack = absl::Milliseconds(500);
  auto it = live_reqs_.find(id);
  if (it == live_reqs_.end()) return;
  const std::optional<absl::Time>& deadline = it->second->spec.deadline;
  if (deadline.has_value() &&
      *deadline - clock_->Now() <= kClientDeadlineSlack) {
    return FinishDeadline(id, *it->second);
  }
  FinishRequest(id, FinishReason::kCancelled);
}

void Engine::Impl::EmitToken(LiveRequest& r, SampleResult& res, absl::Time now,
                             double gap) {
  if (r.first_token == absl::InfinitePast()) {
    r.first_token = now;
    if (metrics_) metrics_->ObserveTtft(SecondsBetween(r.arrival, now));
  } else if (metrics_) {
    metrics_->ObserveInterToken(gap);
  }
  r.last_token = now;
  ++r.completion_tokens;
  OutputProcessor::Step step = r.output->Accept(res.token);
  std::vector<TokenLogprobs> lp;
  if (r.spec.sampling.logprobs > 0) {
    lp.push_back({res.token, res.logprob, std::move(res.top)});
  }
  r.stream->Push(r.index, {res.token}, step.text, std::move(lp));
  // A stop condition is the output's; the length is the scheduler's (it
  // hands back the requests it ended: RetireFinished).
  if (step.stop) FinishRequest(r.id, FinishReason::kStop);
}

void Engine::Impl::EmitTokens(const scheduler::SchedulerOutput& out,
                              StepResult& result) {
  const absl::Time now = clock_->Now();
  size_t first = 0;
  int64_t emitted = 0;
  for (size_t k = 0; k < result.producers.size(); ++k) {
    const auto& s = out.scheduled[result.producers[k]];
    const int32_t n = result.counts.empty() ? 1 : result.counts[k];
    const size_t begin = first;
    first += n;
    auto it = live_reqs_.find(s.id);
    if (it == live_reqs_.end()) continue;
    LiveRequest& r = *it->second;
    if (s.num_draft_tokens > 0) {
      r.draft_tokens += s.num_draft_tokens;
      r.accepted_draft_tokens += n - 1;
      r.speculation.Observe(s.num_draft_tokens, n - 1);
      if (metrics_) metrics_->AddSpeculation(s.num_draft_tokens, n - 1);
    }
    // The step's tokens share the time since the request's previous one.
    const double gap =
        r.last_token == absl::InfinitePast()
            ? 0.0
            : SecondsBetween(r.last_token, now) / static_cast<double>(n);
    for (size_t j = begin; j < first; ++j) {
      EmitToken(r, result.sampled[j], now, gap);
      ++emitted;
      // A stop ended it (and forgot it): its later tokens are dropped.
      if (!live_reqs_.contains(s.id)) break;
    }
  }
  if (metrics_) metrics_->AddGenerationTokens(emitted);
}

void Engine::Impl::ProposeDrafts() {
  const SpeculativeConfig& c = config_.speculative;
  if (c.mode == SpeculativeMode::kOff) return;
  // The running requests that decode next (one token left to compute).
  std::vector<const scheduler::Request*> decoding;
  for (const RequestId id : scheduler_->RunningIds()) {
    const scheduler::Request* r = scheduler_->GetRequest(id);
    if (r != nullptr && r->num_tokens() - r->num_computed_tokens() == 1) {
      decoding.push_back(r);
    }
  }
  if (decoding.empty() ||
      decoding.size() > static_cast<size_t>(c.max_decode_batch)) {
    return;
  }
  std::vector<DraftQuery> queries;  // for the draft model
  for (const scheduler::Request* r : decoding) {
    const RequestId id = r->id();
    auto it = live_reqs_.find(id);
    if (it == live_reqs_.end() || !it->second->spec.speculate) continue;
    int32_t k = std::min(r->max_tokens() - r->num_output_tokens() - 1,
                         it->second->speculation.Draft(
                             c.num_tokens, spec_cost_.PerDraftToken()));
    if (kvcache::KvLowBits(info_.kv_dtype) > 0) {
      // int3/int2: within the key group of its last known token, so that
      // every token verified reads the groups in full precision that it
      // would read decoded alone (models/cpu/kv_residual.h).
      constexpr int32_t kGroup = kvcache::kKvKeyGroupTokens;
      k = std::min(k, kGroup - 1 - (r->num_tokens() - 1) % kGroup);
    }
    if (k <= 0) continue;
    if (draft_) {
      queries.push_back({.id = id, .tokens = r->tokens(), .max_tokens = k});
      continue;
    }
    std::vector<int32_t> draft =
        NgramDraft(r->tokens(), c.ngram_max, c.ngram_min, k);
    if (draft.empty()) {
      it->second->speculation.NoDraft();
    } else {
      scheduler_->SetDraft(id, std::move(draft));
    }
  }
  if (queries.empty()) return;
  const double seconds = draft_->forward_seconds();
  absl::StatusOr<std::vector<std::vector<int32_t>>> drafts =
      draft_->Propose(queries);
  const double draft_seconds = draft_->forward_seconds() - seconds;
  if (metrics_) metrics_->AddDraftModelSeconds(draft_seconds);
  if (!drafts.ok()) {
    spdlog::error("speculative decoding: the draft model failed: {}",
                  drafts.status().ToString());
    if (metrics_) metrics_->AddDraftFailure();
    return;
  }
  int64_t drafted = 0;
  for (const std::vector<int32_t>& d : *drafts) {
    drafted += static_cast<int64_t>(d.size());
  }
  spec_cost_.ObserveDraft(draft_seconds, drafted);
  for (size_t i = 0; i < queries.size(); ++i) {
    std::vector<int32_t>& draft = (*drafts)[i];
    if (draft.empty()) {
      live_reqs_.at(queries[i].id)->speculation.NoDraft();
    } else {
      scheduler_->SetDraft(queries[i].id, std::move(draft));
    }
  }
}

void Engine::Impl::Step() {
  loop_owner_.CheckOwner("Engine::Impl::Step");
  const absl::Time t0 = clock_->Now();
  ProposeDrafts();
  scheduler::SchedulerOutput out = scheduler_->Schedule();
  MarkPreempted(out.preempted, t0);
  if (out.empty()) return MoveBlocksOnly(out);
  for (const auto& s : out.scheduled) FirstScheduled(s, t0);
  StepResult result = runner_->Execute(out);
  if (metrics_) {
    metrics_->AddForwardSeconds(result.forward_seconds);
    metrics_->AddKeyGroupsRebuilt(result.kv_groups_rebuilt);
    metrics_->AddGrammarMasks(result.grammar_masks, result.grammar_seconds);
  }
  AddStepCounters(out.stats, result.swapped_out_blocks,
                  result.swapped_in_blocks);
  if (!result.status.ok()) FailStep(out, result.status);
  if (result.status.ok() && config_.speculative.mode != SpeculativeMode::kOff &&
      result.load.tokens == result.load.seqs + result.draft_tokens) {
    spec_cost_.ObserveStep(result.forward_seconds, result.load.seqs,
                           result.draft_tokens);
  }
  if (result.status.ok() && !result.block_mass.empty()) {
    scheduler_->AddBlockMass(out, result.block_mass, result.block_mass_stride);
  }
  std::vector<scheduler::FinishedRequest> finished =
      scheduler_->UpdateFromOutput(out, result.tokens, result.counts);
  // Write-through of the blocks just registered, before any can be reused.
  if (tiers_) tiers_->StoreNewlyCached();
  if (result.status.ok()) Deliver(out, result);
  RetireFinished(finished);
  EndStep(out, result, t0);
}

void Engine::Impl::MarkPreempted(const std::vector<RequestId>& preempted,
                                 absl::Time t0) {
  for (const RequestId id : preempted) {
    auto it = live_reqs_.find(id);
    if (it != live_reqs_.end()) it->second->preempted_at = t0;
  }
}

// A step may preempt by swap and schedule nothing (its blocks go to a more
// important waiting request next step): the swap-outs still run.
void Engine::Impl::MoveBlocksOnly(const scheduler::SchedulerOutput& out) {
  StepResult moved;
  if (absl::Status s = runner_->RunBlockMoves(out, &moved); !s.ok()) {
    spdlog::error("block moves failed at step {}: {}", out.step, s.ToString());
    FailAll(out.preempted, s.ToString());
  }
  AddStepCounters(out.stats, moved.swapped_out_blocks, moved.swapped_in_blocks);
  WaitAfterEmptyStep();
}

void Engine::Impl::Deliver(const scheduler::SchedulerOutput& out,
                           StepResult& result) {
  // Forks first: the parent may finish on its first token below.
  for (const auto& [id, logits] : result.fork_logits) {
    ForkChildren(id, logits);
  }
  EmitTokens(out, result);
}

void Engine::Impl::RetireFinished(
    const std::vector<scheduler::FinishedRequest>& finished) {
  for (const auto& f : finished) {
    // Gone already when its last token also met a stop condition.
    if (live_reqs_.contains(f.id)) CloseRequest(f.id, f.reason, &f);
  }
}

void Engine::Impl::EndStep(const scheduler::SchedulerOutput& out,
                           const StepResult& result, absl::Time t0) {
  // The pool, the prefix index, the swap space and the tier loads agree
  // after every step (debug and sanitizer builds, or --kv-debug-invariants).
  if (KV_DCHECK_IS_ON || config_.debug_invariants) {
    const absl::Status s = scheduler_->CheckInvariants();
    KV_CHECK(s.ok(), "KV invariants broken after step ", out.step, ": ",
             s.ToString());
    if (tiers_) {
      const absl::Status t = tiers_->CheckInvariants();
      KV_CHECK(t.ok(), "KV tier invariants broken after step ", out.step, ": ",
               t.ToString());
    }
  }
  PublishStats(SecondsBetween(t0, clock_->Now()), out.total_num_tokens);
  if (step_observer_) {
    // The whole loop turn: what the next step waits for.
    step_observer_({out.step, inbox_taken_,
                    SecondsBetween(inbox_taken_, clock_->Now()),
                    result.forward_seconds, result.load});
  }
}

void Engine::Impl::AddStepCounters(const scheduler::StepStats& s,
                                   int64_t swapped_out, int64_t swapped_in) {
  if (!metrics_) return;
  metrics_->AddPreemptions(s);
  metrics_->AddRecomputedTokens(s.recomputed_tokens);
  metrics_->AddSwapBlocks(swapped_out, swapped_in);
  metrics_->AddUncacheableTokens(s.prefix_cache_uncacheable_tokens);
  metrics_->AddTailHits(s.prefix_cache_tail_hits);
  metrics_->AddDroppedBlocks(s.dropped_blocks);
  metrics_->AddPrefixCache(s.prefix_cache_queries_tokens,
                           s.prefix_cache_hit_tokens);
}

// Nothing fits this step (e.g. waiting for blocks); don't spin.
void Engine::Impl::WaitAfterEmptyStep() {
  absl::MutexLock lock(&mu_);
  auto has_input = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stop_ || !inbox_.adds.empty() || !inbox_.aborts.empty();
  };
  mu_.AwaitWithTimeout(absl::Condition(&has_input), absl::Milliseconds(1));
}

// A batch the model rejects is a bug in batch construction (or in the
// block-move plan); fail the requests in it, keep serving the rest.
// NOTE: they finish before UpdateFromOutput, which would register their
// (unwritten) blocks in the prefix cache; it skips finished requests.
void Engine::Impl::FailStep(const scheduler::SchedulerOutput& out,
                            const absl::Status& status) {
  spdlog::error("forward failed at step {} ({} tokens): {}", out.step,
                out.total_num_tokens, status.ToString());
  std::vector<RequestId> ids;
  ids.reserve(out.scheduled.size());
  for (const auto& s : out.scheduled) ids.push_back(s.id);
  FailAll(ids, status.ToString());
}

void Engine::Impl::FailAll(const std::vector<RequestId>& ids,
                           const std::string& error) {
  for (RequestId id : ids) {
    if (live_reqs_.contains(id)) FinishRequest(id, FinishReason::kError, error);
  }
}

void Engine::Impl::FinishRequest(RequestId id, FinishReason reason,
                                 const std::string& error) {
  loop_owner_.CheckOwner("Engine::Impl::FinishRequest");
  if (!live_reqs_.contains(id)) return;
  // The scheduler frees its blocks now and hands back its record; NotFound:
  // it never entered the scheduler (a fork child that ends on its first
  // token, or whose fork failed), or a failed admission removed it.
  absl::StatusOr<scheduler::FinishedRequest> f = scheduler_->Finish(id, reason);
  if (!f.ok() && !absl::IsNotFound(f.status())) {
    spdlog::error("request {}: the scheduler could not end it: {}", id,
                  f.status().ToString());
  }
  CloseRequest(id, reason, f.ok() ? &*f : nullptr, error);
}

void Engine::Impl::CloseRequest(RequestId id, FinishReason reason,
                                const scheduler::FinishedRequest* record,
                                const std::string& error) {
  if (tiers_) tiers_->Release(id);
  auto it = live_reqs_.find(id);
  LiveRequest& r = *it->second;
  if (record != nullptr) {
    r.num_preemptions = record->num_preemptions;
    r.kv_stats = record->kv_stats;
  }
  const std::string tail = r.output ? r.output->Flush() : "";
  if (!tail.empty()) r.stream->Push({}, tail, {});
  const absl::Time now = clock_->Now();
  Usage usage;
  usage.prompt_tokens = static_cast<int32_t>(r.spec.prompt_tokens.size());
  usage.completion_tokens = r.completion_tokens;
  usage.cached_prompt_tokens = r.cached_prompt_tokens;
  Timings t;
  t.arrival = r.arrival;
  if (r.first_scheduled != absl::InfinitePast()) {
    t.queue_seconds = SecondsBetween(r.arrival, r.first_scheduled);
  }
  usage.kv = KvUsageOf(r, t.queue_seconds, now);
  if (r.first_token != absl::InfinitePast()) {
    t.time_to_first_token = SecondsBetween(r.arrival, r.first_token);
  }
  t.total_seconds = SecondsBetween(r.arrival, now);
  // Counted before the stream ends, so that a client which scrapes the
  // metrics as soon as its call returns sees its request among them.
  ReleaseQueued(r);
  if (metrics_) {
    metrics_->Finished(reason, t.total_seconds);
    metrics_->ObserveRequestPreemptions(r.num_preemptions);
    metrics_->TenantFinished(r.spec.tenant.name, usage, r.num_preemptions);
  }
  r.stream->Finish(r.index, reason, usage, t, error);
  // Children never forked (the parent ended before its first token) end
  // with it, so that the stream completes.
  for (int32_t i = 1; i <= r.pending_forks; ++i) {
    Usage unforked = usage;
    unforked.completion_tokens = 0;
    unforked.kv = KvUsage{.kv_dtype = info_.kv_dtype};
    r.stream->Finish(i, reason, unforked, t, error);
  }
  r.pending_forks = 0;
  if (r.spec.deadline.has_value()) deadlines_.erase({*r.spec.deadline, id});
  runner_->RemoveRequest(id);
  if (draft_) draft_->Forget(id);
  live_reqs_.erase(it);
  absl::MutexLock lock(&mu_);
  --live_;
}

// Every kKvStateInterval while someone read a snapshot lately, else every
// kKvStateIdleInterval (so that a first or rare reader never gets an old
// one), and once at start.
void Engine::Impl::MaybeBuildKvState() {
  constexpr absl::Duration kKvStateInterval = absl::Milliseconds(200);
  constexpr absl::Duration kKvStateIdleInterval = absl::Seconds(1);
  constexpr absl::Duration kKvStateInterest = absl::Seconds(10);
  // Real time: these throttle CPU work and readers' interest.
  const absl::Time now = absl::Now();
  const absl::Time wanted = absl::FromUnixNanos(kv_state_wanted_ns_.load());
  const absl::Duration interval =
      now - wanted > kKvStateInterest ? kKvStateIdleInterval : kKvStateInterval;
  if (now - kv_state_built_ < interval) return;
  KvState state = BuildKvState(*scheduler_, info_.kv_dtype,
                               info_.kv_bytes_per_block, WrittenSlots());
  if (tiers_) state.tiers = tiers_->StateOf();
  auto st = std::make_shared<const KvState>(std::move(state));
  kv_state_built_ = now;
  absl::MutexLock lock(&kv_state_mu_);
  kv_state_ = std::move(st);
}

std::shared_ptr<const KvState> Engine::Impl::KvStateSnapshot() const {
  kv_state_wanted_ns_.store(absl::GetCurrentTimeNanos());
  absl::MutexLock lock(&kv_state_mu_);
  return kv_state_;
}

KvUsage Engine::Impl::KvUsageOf(const LiveRequest& r, double queued_seconds,
                                absl::Time now) const {
  const scheduler::RequestKvStats& s = r.kv_stats;
  const int64_t block_bytes = info_.kv_bytes_per_block;
  KvUsage kv;
  kv.kv_dtype = info_.kv_dtype;
  kv.peak_blocks = s.peak_blocks;
  kv.peak_bytes = s.peak_blocks * block_bytes;
  kv.preemptions_recompute = s.preemptions_recompute;
  kv.preemptions_swap = s.preemptions_swap;
  kv.recomputed_tokens = s.recomputed_tokens;
  kv.dropped_tokens = s.dropped_tokens;
  kv.draft_tokens = r.draft_tokens;
  kv.accepted_draft_tokens = r.accepted_draft_tokens;
  kv.swapped_out_bytes = s.swapped_out_blocks * block_bytes;
  kv.swapped_in_bytes = s.swapped_in_blocks * block_bytes;
  kv.queued_seconds = queued_seconds;
  kv.preempted_seconds = r.preempted_seconds;
  // Loaded blocks are matched first-come like any cached block: the split
  // credits each tier with at most what its load brought in (the host's
  // blocks come first in the prompt, then the disk's).
  int32_t left = r.cached_prompt_tokens;
  kv.cached_tokens_host = std::min(r.host_prompt_tokens, left);
  left -= kv.cached_tokens_host;
  kv.cached_tokens_disk = std::min(r.disk_prompt_tokens, left);
  left -= kv.cached_tokens_disk;
  kv.cached_tokens_remote = std::min(r.remote_prompt_tokens, left);
  kv.cached_tokens_device = left - kv.cached_tokens_remote;
  if (r.preempted_at != absl::InfinitePast()) {
    kv.preempted_seconds += SecondsBetween(r.preempted_at, now);
  }
  return kv;
}

int64_t Engine::Impl::WrittenSlots() const {
  return scheduler_->kv_cache().WrittenSlots([this](RequestId id) {
    const scheduler::Request* r = scheduler_->GetRequest(id);
    return r == nullptr ? 0 : r->kv_tokens();
  });
}

// Token slots walk every block table (~60 us for 25K blocks in 256
// tables): at most every kSlotsInterval while requests run, and at once
// when none do (then it costs nothing). The four gauges come from one
// reading, so they always sum to the capacity.
void Engine::Impl::PublishTokenSlots(const kvcache::KvUsage& kv) {
  constexpr absl::Duration kSlotsInterval = absl::Milliseconds(50);
  const absl::Time now = absl::Now();  // real: throttles CPU work
  if (scheduler_->num_running() > 0 &&
      now - slots_published_ < kSlotsInterval) {
    return;
  }
  slots_published_ = now;
  const int64_t bs = config_.scheduler.block_size;
  const int64_t written = WrittenSlots();
  metrics_->SetTokenSlots(written, kv.active_blocks * bs - written,
                          kv.cached_evictable_blocks * bs,
                          (kv.free_blocks - kv.cached_evictable_blocks) * bs);
}

void Engine::Impl::PublishStats(double step_seconds, int64_t tokens) {
  const scheduler::SchedulerStats s = scheduler_->stats();
  int64_t reserved = 0;
  int64_t unwritten = 0;
  for (RequestId id : scheduler_->RunningIds()) {
    const scheduler::Request* r = scheduler_->GetRequest(id);
    const int64_t blocks = scheduler_->kv_cache().GetBlockTable(id).size();
    reserved += blocks * config_.scheduler.block_size;
    unwritten += blocks * config_.scheduler.block_size - r->kv_tokens();
  }
  {
    absl::MutexLock lock(&mu_);
    queued_ = s.num_waiting_seqs;
    for (const auto& r : inbox_.adds) queued_ += r->spec.n;
  }
  if (metrics_) {
    // Token slots first: once a scrape sees kvserve_kv_blocks{active} at 0,
    // the slots it sees are final too.
    PublishTokenSlots(s.kv);
    metrics_->SetKvBlocks(s.kv.active_blocks, s.kv.cached_evictable_blocks,
                          s.kv.free_blocks - s.kv.cached_evictable_blocks);
    metrics_->SetQueues(s.num_running, s.num_waiting);
    metrics_->SetReservedSlots(reserved, unwritten);
    metrics_->SetSwapBlocks(s.swap_slots_used,
                            runner_->backend().num_swap_slots());
    if (tokens > 0) metrics_->ObserveStep(step_seconds, tokens);
  }
  if (tier_metrics_) tier_metrics_->Publish(tiers_->stats());
  if (kv_event_metrics_) kv_event_metrics_->Publish(kv_events_->stats());
  absl::MutexLock lock(&stats_mu_);
  stats_.running = s.num_running;
  stats_.waiting = s.num_waiting;
  stats_.blocks_total = s.kv.total_blocks;
  stats_.blocks_free = s.kv.free_blocks - s.kv.cached_evictable_blocks;
  stats_.blocks_cached = s.kv.cached_evictable_blocks;
  stats_.blocks_active = s.kv.active_blocks;
  stats_.reserved_slots = reserved;
  stats_.reserved_unwritten_slots = unwritten;
  stats_.steps = s.num_steps;
  stats_.last_step_end = absl::Now();
}

}  // namespace kvserve::engine
