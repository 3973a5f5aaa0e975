#include "scheduler/scheduler.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::scheduler {
namespace {

SchedulerConfig ValidConfig(const SchedulerConfig& config) {
  const absl::Status s = config.Validate();
  KV_CHECK(s.ok(), "invalid config: ", s.ToString());
  return config;
}

}  // namespace

int32_t SchedulerOutput::num_producing() const {
  int32_t n = 0;
  for (const ScheduledRequest& s : scheduled) n += s.produces_token ? 1 : 0;
  return n;
}

absl::string_view AdmissionStopName(AdmissionStop stop) {
  switch (stop) {
    case AdmissionStop::kNone:
      return "none";
    case AdmissionStop::kQueueEmpty:
      return "queue_empty";
    case AdmissionStop::kMaxNumSeqs:
      return "max_num_seqs";
    case AdmissionStop::kTokenBudget:
      return "token_budget";
    case AdmissionStop::kKvBlocks:
      return "kv_blocks";
    case AdmissionStop::kPreempted:
      return "preempted";
    case AdmissionStop::kHighWatermark:
      return "high_watermark";
    case AdmissionStop::kThrashGuard:
      return "thrash_guard";
    case AdmissionStop::kTenantCap:
      return "tenant_cap";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(
    const SchedulerConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  return std::make_unique<Scheduler>(config);
}

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(ValidConfig(config)),
      reservation_(MakeReservation(config_)),
      victims_(MakeVictimPolicy(config_.policy)),
      watermark_blocks_(config.watermark_blocks()),
      kv_(config.num_blocks, config.block_size, &kvcache::HashBlockTokens,
          config.num_swap_slots),
      fair_(config.max_num_seqs) {}

absl::Status Scheduler::AddRequest(std::unique_ptr<Request> request) {
  owner_.CheckOwner("Scheduler");
  if (request == nullptr) return absl::InvalidArgumentError("null request");
  KV_RETURN_IF_ERROR(CheckRequest(*request));
  if (static_cast<int32_t>(waiting_.size()) >= config_.max_queued_requests) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "waiting queue is full: ", waiting_.size(),
        " requests (max_queued_requests=", config_.max_queued_requests, ")"));
  }
  Request* r = request.get();
  r->status_ = RequestStatus::kWaiting;
  r->num_computed_tokens_ = 0;
  r->arrival_seq_ = next_arrival_seq_++;
  r->cache_ns_ = kvcache::NamespaceHash(config_.model_id, r->cache_scope(),
                                        r->cache_salt());
  r->tenant_id_ = fair_.Join(r->tenant_);
  requests_.emplace(r->id(), std::move(request));
  Enqueue(r, /*at_head=*/false);
  return absl::OkStatus();
}

absl::Status Scheduler::CheckRequest(const Request& r) const {
  if (requests_.contains(r.id())) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", r.id(), " already exists"));
  }
  // Its sequences must fit at once, or it could never be admitted.
  if (r.seats() > config_.max_num_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("n: ", r.seats(), " completions, over max_num_seqs (",
                     config_.max_num_seqs, ")"));
  }
  if (r.tenant().max_running > 0 && r.seats() > r.tenant().max_running) {
    return absl::InvalidArgumentError(absl::StrCat(
        "n: ", r.seats(), " completions, over tenant '", r.tenant().name,
        "''s max_running (", r.tenant().max_running, ")"));
  }
  const KvWindow& w = r.kv_window();
  if (w.enabled()) {
    KV_RETURN_IF_ERROR(config_.CheckKvWindow(w.sinks, w.window, w.budget));
  }
  return config_.CheckRequestSize(r.num_prompt_tokens(), r.max_tokens(),
                                  w.enabled());
}

absl::StatusOr<FinishedRequest> Scheduler::Finish(RequestId id,
                                                  FinishReason reason) {
  owner_.CheckOwner("Scheduler");
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", id, " is not live"));
  }
  Request* r = it->second.get();
  if (r->status_ == RequestStatus::kRunning) {
    auto pos = std::find(running_.begin(), running_.end(), r);
    KV_CHECK(pos != running_.end(), "request ", id, " running but unlisted");
    running_.erase(pos);
    LeaveRunning(r);
  } else {
    Dequeue(r);
  }
  FinishedRequest f{id, reason, r->num_preemptions_, r->kv_stats_};
  Retire(r, reason);
  return f;
}

void Scheduler::Retire(Request* r, FinishReason reason) {
  // Between Schedule and UpdateFromOutput its last tokens may be unwritten.
  if (!pending_update_) CachePartialBlock(*r);
  kv_.Free(r->id());  // blocks, or swap slots of a swapped-out request
  switch (reason) {
    case FinishReason::kStop:
      r->status_ = RequestStatus::kFinishedStopped;
      break;
    case FinishReason::kLength:
      r->status_ = RequestStatus::kFinishedLength;
      break;
    case FinishReason::kNone:
    case FinishReason::kCancelled:
    case FinishReason::kDeadline:
    case FinishReason::kError:
      r->status_ = RequestStatus::kFinishedAborted;
      ++num_aborted_total_;
      break;
  }
  ++num_finished_total_;
  fair_.Leave(r->tenant_id_);
  const RequestId id = r->id();
  requests_.erase(id);  // destroys *r
}

double Scheduler::Rank(const Request& r) const {
  const double aging = config_.priority_aging_seconds;
  return aging > 0 ? r.priority() + r.arrival_time_ns() / (aging * 1e9)
                   : static_cast<double>(r.priority());
}

void Scheduler::Enqueue(Request* r, bool at_head) {
  if (config_.policy == SchedulingPolicy::kPriority) {
    // NOTE: a preempted request keeps its arrival key: among its priority it
    // precedes every later arrival, which is the head for it.
    r->queue_key_ = {Rank(*r), r->arrival_seq(), r->id()};
  } else if (config_.policy == SchedulingPolicy::kCacheAware) {
    r->queue_key_ = {Rank(*r), at_head ? next_head_order_-- : r->arrival_seq(),
                     r->id()};
  } else {
    r->queue_key_ = {0, at_head ? next_head_order_-- : r->arrival_seq(),
                     r->id()};
  }
  KV_CHECK(waiting_.emplace(r->queue_key_, r).second, "request ", r->id(),
           " queued twice");
  fair_.Enqueue(r);
}

void Scheduler::Dequeue(Request* r) {
  KV_CHECK(waiting_.erase(r->queue_key_) == 1, "request ", r->id(),
           " status=", RequestStatusName(r->status_), " not queued");
  fair_.Dequeue(r);
}

void Scheduler::AddRunning(Request* r) {
  running_.push_back(r);
  fair_.AddRunningSeats(r->tenant_id_, r->seats());
}

void Scheduler::LeaveRunning(const Request* r) {
  fair_.AddRunningSeats(r->tenant_id_, -r->seats());
}

SchedulerOutput Scheduler::Schedule() {
  owner_.CheckOwner("Scheduler");
  KV_CHECK(!pending_update_, "Schedule() before UpdateFromOutput() of step ",
           num_steps_ - 1);
  const StepStats before = CumulativeStepStats();
  // The previous step's copies have run: their tail sources may go.
  kv_.ReleasePinned();
  for (Request* r : running_) {
    if (r->kv_window_.enabled()) DropOutOfWindow(*r);
  }
  StepPlan plan;
  plan.budget = config_.max_num_batched_tokens;
  plan.scheduled.reserve(running_.size() + 8);
  ScheduleDecodes(plan);
  // The short lane (scheduler.h): a small step, the short request's tokens
  // and as many for the long prefills.
  Request* short_lane = ShortLaneCandidate(plan.budget);
  int32_t cut = 0;
  if (short_lane != nullptr) {
    plan.reserve =
        std::min(short_lane->num_tokens() - short_lane->num_computed_tokens_,
                 plan.budget / 2);
    const int32_t small = std::min(plan.budget, 2 * plan.reserve);
    cut = plan.budget - small;
    plan.budget = small;
  }
  SchedulePrefills(plan);
  if (plan.preempted.empty()) {
    // A short head takes its share in order; one behind a long head
    // takes it after normal admission.
    const int32_t held = short_lane == AdmissionCandidate() ? 0 : plan.reserve;
    plan.budget -= held;
    AdmitWaiting(plan);
    plan.budget += held;
    AdmitShortLane(short_lane, plan);
    PreemptForPriority(plan);
  } else {
    last_admission_stop_ = AdmissionStop::kPreempted;
  }
  // The lane's request was admitted: the step stays small. Otherwise the
  // step takes the whole budget after all. Either way the next step is a
  // whole one (a head the small budget kept out, e.g. by the thrash guard,
  // gets in there).
  last_step_short_lane_ = short_lane != nullptr;
  if (short_lane == nullptr || short_lane->status_ != RequestStatus::kRunning) {
    plan.budget += cut;
    TopUpPrefills(plan);
  }
  SchedulerOutput out = BuildOutput(plan);
  // Drafts are for this step only (their tokens are in `out` now).
  for (Request* r : running_) r->draft_.clear();
  for (const RequestId id : out.preempted) {
    if (auto it = requests_.find(id); it != requests_.end()) {
      it->second->draft_.clear();
    }
  }
  const StepStats after = CumulativeStepStats();
  out.stats = {
      .preemptions_recompute =
          after.preemptions_recompute - before.preemptions_recompute,
      .preemptions_swap = after.preemptions_swap - before.preemptions_swap,
      .priority_preemptions_recompute = after.priority_preemptions_recompute -
                                        before.priority_preemptions_recompute,
      .priority_preemptions_swap =
          after.priority_preemptions_swap - before.priority_preemptions_swap,
      .recomputed_tokens = after.recomputed_tokens - before.recomputed_tokens,
      .prefix_cache_queries_tokens = after.prefix_cache_queries_tokens -
                                     before.prefix_cache_queries_tokens,
      .prefix_cache_hit_tokens =
          after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens,
      .prefix_cache_uncacheable_tokens = after.prefix_cache_uncacheable_tokens -
                                         before.prefix_cache_uncacheable_tokens,
      .prefix_cache_tail_hits =
          after.prefix_cache_tail_hits - before.prefix_cache_tail_hits,
      .dropped_blocks = after.dropped_blocks - before.dropped_blocks,
  };
  pending_update_ = !out.scheduled.empty();
  ++num_steps_;
  return out;
}

StepStats Scheduler::CumulativeStepStats() const {
  return {
      .preemptions_recompute =
          num_preemptions_total_ - num_preemptions_swap_total_,
      .preemptions_swap = num_preemptions_swap_total_,
      .priority_preemptions_recompute =
          num_priority_preemptions_recompute_total_,
      .priority_preemptions_swap = num_priority_preemptions_swap_total_,
      .recomputed_tokens = num_preempted_tokens_total_,
      .prefix_cache_queries_tokens = prefix_cache_queries_tokens_,
      .prefix_cache_hit_tokens = prefix_cache_hit_tokens_,
      .prefix_cache_uncacheable_tokens = prefix_cache_uncacheable_tokens_,
      .prefix_cache_tail_hits = num_tail_copies_total_,
      .dropped_blocks = num_dropped_blocks_total_,
  };
}

int32_t Scheduler::NumNewTokens(const Request& r, int32_t computed,
                                int32_t budget) const {
  int32_t n = r.num_tokens() - computed;
  if (config_.long_prefill_token_threshold > 0) {
    n = std::min(n, config_.long_prefill_token_threshold);
  }
  if (r.kv_window_.enabled()) {
    // Its table never passes max_model_len (the backends size block tables
    // by it); CheckKvWindow leaves room for at least a block after a drop.
    n = std::min(n, config_.max_model_len - (computed - r.kv_dropped_tokens_));
  }
  return std::min(n, budget);
}

void Scheduler::ScheduleDecodes(StepPlan& plan) {
  // Decodes not yet scheduled: drafts leave each of them its one token.
  int64_t decodes = 0;
  for (const Request* r : running_) {
    if (r->num_tokens() - r->num_computed_tokens_ == 1) ++decodes;
  }
  size_t i = 0;
  while (i < running_.size() && plan.budget > 0) {
    Request* r = running_[i];
    KV_CHECK(r->num_tokens() > r->num_computed_tokens_, "running request ",
             r->id(), " has nothing to compute");
    if (r->num_tokens() - r->num_computed_tokens_ != 1) {
      ++i;
      continue;
    }
    // Its draft (SetDraft), as far as the budget (less one token for each
    // decode after it), max_tokens and the free blocks go.
    --decodes;
    r->draft_.resize(std::max(0, DraftTokens(*r, plan.budget - 1 - decodes)));
    const int32_t n = 1 + static_cast<int32_t>(r->draft_.size());
    if (!AllocateOrPreempt(&i, n, plan)) continue;  // running_[i] moved on
    plan.scheduled.emplace_back(r, n);
    plan.budget -= n;
    ++i;
  }
}

Request* Scheduler::ShortLaneCandidate(int32_t budget) const {
  const int32_t threshold = config_.long_prefill_token_threshold > 0
                                ? config_.long_prefill_token_threshold
                                : config_.max_num_batched_tokens;
  auto left = [](const Request* r) {
    return r->num_tokens() - r->num_computed_tokens_;
  };
  // Every other step at most, so long prefills keep at least half of the
  // steps whole.
  if (last_step_short_lane_) return nullptr;
  Request* next = AdmissionCandidate();
  if (next == nullptr) return nullptr;
  // Only long prefills (running, or ahead in the queue) that would take
  // the whole budget make a short request wait.
  bool long_prefill = left(next) > threshold;
  int64_t demand = 0;
  for (const Request* r : running_) {
    if (left(r) <= 1) continue;
    long_prefill |= left(r) > threshold;
    demand += std::min(left(r), threshold);
  }
  // A short head is admitted in order (the share is kept for it); a long
  // one may be passed.
  if (left(next) <= threshold) {
    return long_prefill && demand + left(next) > budget ? next : nullptr;
  }
  if (!long_prefill) return nullptr;
  int32_t looked = 0;
  for (auto it = waiting_.begin();
       it != waiting_.end() && looked < kShortLaneWindow; ++it, ++looked) {
    Request* r = it->second;
    if (left(r) > threshold) {
      demand += threshold;  // it would take a chunk first
      continue;
    }
    if (demand + left(r) <= budget) return nullptr;  // it fits anyway
    // Fair share holds: its tenant is the next one's or below its share.
    if (!fair_.UnderCap(r->tenant_id_, r->seats()) ||
        (r->tenant_id_ != next->tenant_id_ &&
         fair_.AtOrAboveShare(r->tenant_id_))) {
      continue;
    }
    return r;
  }
  return nullptr;
}

void Scheduler::AdmitShortLane(Request* r, StepPlan& plan) {
  // Only when the step's budget is what held the queue back: a head that
  // waits for KV, seats or the watermark is not overtaken.
  if (r == nullptr || r->status_ == RequestStatus::kRunning ||
      last_admission_stop_ != AdmissionStop::kTokenBudget || plan.budget <= 0 ||
      fair_.running_seats() + r->seats() > config_.max_num_seqs ||
      !fair_.UnderCap(r->tenant_id_, r->seats())) {
    return;
  }
  const kvcache::PrefixMatch match = MatchPrefix(*r);
  const int32_t start = std::max(match.num_tokens, r->num_computed_tokens_);
  const int32_t n = NumNewTokens(*r, start, plan.budget);
  if (r->consecutive_preemptions_ >= config_.thrash_preemption_limit &&
      config_.thrash_preemption_limit > 0) {
    return;
  }
  if (!CanAdmit(match, start, n)) return;
  Admit(r, match, n, plan);
}

void Scheduler::SchedulePrefills(StepPlan& plan) {
  std::vector<Request*> who;
  std::vector<int32_t> tenant;
  std::vector<int32_t> want;
  for (Request* r : running_) {
    if (r->num_tokens() - r->num_computed_tokens_ <= 1) continue;
    who.push_back(r);
    tenant.push_back(r->tenant_id_);
    want.push_back(NumNewTokens(*r, config_.max_num_batched_tokens));
  }
  if (who.empty() || plan.budget <= 0) return;
  const int32_t shared = plan.budget - plan.reserve;
  const std::vector<int32_t> share = fair_.SplitPrefill(tenant, want, shared);
  for (size_t k = 0; k < who.size(); ++k) {
    Request* r = who[k];
    // A victim of an earlier allocation in this pass is no longer running.
    if (r->status_ != RequestStatus::kRunning) continue;
    plan.prefill_want.emplace_back(r, want[k]);
    const int32_t n = std::min(share[k], plan.budget);
    if (n <= 0) continue;
    size_t i = static_cast<size_t>(
        std::find(running_.begin(), running_.end(), r) - running_.begin());
    if (!AllocateOrPreempt(&i, n, plan)) continue;
    plan.scheduled.emplace_back(r, n);
    plan.budget -= n;
  }
}

void Scheduler::TopUpPrefills(StepPlan& plan) {
  for (const auto& [r, want] : plan.prefill_want) {
    if (plan.budget <= 0) return;
    if (r->status_ != RequestStatus::kRunning) continue;
    auto planned =
        std::find_if(plan.scheduled.begin(), plan.scheduled.end(),
                     [r = r](const auto& p) { return p.first == r; });
    const int32_t have = planned == plan.scheduled.end() ? 0 : planned->second;
    const int32_t extra = std::min(want - have, plan.budget);
    if (extra <= 0) continue;
    const int32_t computed = r->kv_tokens();
    // Never preempts: only blocks that are free now.
    if (!kv_.AllocateForWrite(r->id(), computed,
                              int64_t{computed} + have + extra, &plan.copies)) {
      continue;
    }
    plan.copy_owners.resize(plan.copies.size(), r);
    NotePeakBlocks(*r);
    if (planned == plan.scheduled.end()) {
      plan.scheduled.emplace_back(r, extra);
    } else {
      planned->second += extra;
    }
    plan.budget -= extra;
  }
}

SchedulerOutput Scheduler::BuildOutput(StepPlan& plan) {
  // Running requests in admission order, then newly admitted ones (their
  // admission order too): decodes were planned first, prefills after.
  auto by_admission = [](const auto& a, const auto& b) {
    return a.first->admit_seq_ < b.first->admit_seq_;
  };
  // NOTE: usually sorted already (decodes only, or no decode before a
  // prefill): check before sorting, which allocates.
  if (!std::is_sorted(plan.scheduled.begin(), plan.scheduled.end(),
                      by_admission)) {
    std::stable_sort(plan.scheduled.begin(), plan.scheduled.end(),
                     by_admission);
  }
  SchedulerOutput out;
  out.step = num_steps_;
  out.scheduled.reserve(plan.scheduled.size());
  out.token_ids.reserve(config_.max_num_batched_tokens - plan.budget);
  out.block_ids.reserve(block_ids_hint_);
  for (const auto& [r, n] : plan.scheduled) {
    ScheduledRequest& s = out.scheduled.emplace_back();
    s.id = r->id();
    s.start_position = r->num_computed_tokens_;
    s.kv_offset = r->kv_dropped_tokens_;
    s.track_mass = r->kv_window_.heavy_hitters();
    if (s.kv_offset > 0 && !s.track_mass) {
      s.kv_sink_len =
          r->kv_window_.SinkBlocks(config_.block_size) * config_.block_size;
    }
    s.num_new_tokens = n;
    s.token_offset = static_cast<int32_t>(out.token_ids.size());
    // Known tokens, then a decode's draft (ScheduleDecodes sized it).
    const int32_t known = std::min(n, r->num_tokens() - s.start_position);
    AppendTokens(*r, s.start_position, known, out.token_ids);
    s.num_draft_tokens = n - known;
    KV_CHECK(s.num_draft_tokens <= static_cast<int32_t>(r->draft_.size()),
             "request ", r->id(), " scheduled past its draft");
    out.token_ids.insert(out.token_ids.end(), r->draft_.begin(),
                         r->draft_.begin() + s.num_draft_tokens);
    r->num_computed_tokens_ += n;
    s.produces_token = r->num_computed_tokens_ >= r->num_tokens();
    const std::vector<kvcache::BlockId>& table = kv_.GetBlockTable(r->id());
    s.block_offset = static_cast<int32_t>(out.block_ids.size());
    s.num_blocks = static_cast<int32_t>(table.size());
    out.block_ids.insert(out.block_ids.end(), table.begin(), table.end());
  }
  out.total_num_tokens = static_cast<int32_t>(out.token_ids.size());
  out.preempted = std::move(plan.preempted);
  out.blocks_to_swap_out = std::move(plan.swap_out);
  out.blocks_to_swap_in = std::move(plan.swap_in);
  out.blocks_to_copy = std::move(plan.copies);
  num_scheduled_tokens_total_ += out.total_num_tokens;
  // Next step's tables are about as long: reserve a little more.
  block_ids_hint_ = out.block_ids.size() + out.block_ids.size() / 8 + 64;
  return out;
}

void Scheduler::AppendTokens(const Request& r, int32_t begin, int32_t n,
                             std::vector<int32_t>& out) {
  const int32_t end = begin + n;
  const int32_t prompt_len = r.num_prompt_tokens();
  if (begin < prompt_len) {
    const int32_t stop = std::min(end, prompt_len);
    out.insert(out.end(), r.prompt_.begin() + begin, r.prompt_.begin() + stop);
    begin = stop;
  }
  if (begin < end) {
    out.insert(out.end(), r.output_.begin() + (begin - prompt_len),
               r.output_.begin() + (end - prompt_len));
  }
}

std::vector<FinishedRequest> Scheduler::UpdateFromOutput(
    const SchedulerOutput& output, absl::Span<const int32_t> sampled,
    absl::Span<const int32_t> counts) {
  owner_.CheckOwner("Scheduler");
  KV_CHECK(output.empty() || (pending_update_ && output.step == num_steps_ - 1),
           "UpdateFromOutput of step ", output.step, ", latest is ",
           num_steps_ - 1);
  pending_update_ = false;
  std::vector<FinishedRequest> finished;
  size_t k = 0, producer = 0;
  for (const ScheduledRequest& s : output.scheduled) {
    absl::Span<const int32_t> tokens;
    if (s.produces_token) {
      KV_CHECK(counts.empty() || producer < counts.size(), "counts has ",
               counts.size(), " entries");
      const size_t m = counts.empty() ? 1 : counts[producer];
      KV_CHECK(m >= 1 && m <= static_cast<size_t>(s.num_draft_tokens) + 1,
               "request ", s.id, " sampled ", m, " tokens with ",
               s.num_draft_tokens, " drafted");
      KV_CHECK(k + m <= sampled.size(), "sampled has ", sampled.size(),
               " tokens");
      tokens = sampled.subspan(k, m);
      k += m;
      ++producer;
    }
    auto it = requests_.find(s.id);
    // Finished (e.g. aborted) since Schedule(): drop its tokens.
    if (it == requests_.end()) continue;
    Request* r = it->second.get();
    if (r->status_ != RequestStatus::kRunning) continue;
    if (s.num_draft_tokens > 0) {  // KV of the rejected drafts rolled back
      const int32_t accepted = static_cast<int32_t>(tokens.size()) - 1;
      r->num_computed_tokens_ -= s.num_draft_tokens - accepted;
      kv_.TrimBlocks(r->id(), static_cast<int32_t>(
                                  reservation_->HeldBlocks(r->kv_tokens())));
    }
    bool at_length = false;
    if (s.produces_token) {
      r->consecutive_preemptions_ = 0;  // it caught up: not thrashing
      for (const int32_t token : tokens) {
        r->output_.push_back(token);
        at_length = r->num_output_tokens() >= r->max_tokens();
        if (at_length) break;
      }
    }
    // Its KV of this step is written now: register its full blocks (after
    // the tokens, so a block its accepted drafts filled is one of them).
    CacheComputedBlocks(*r);
    if (at_length) {
      r->status_ = RequestStatus::kFinishedLength;
      finished.push_back(
          {r->id(), FinishReason::kLength, r->num_preemptions_, r->kv_stats_});
    }
  }
  KV_CHECK(k == sampled.size(), "sampled has ", sampled.size(),
           " tokens, output produces ", k);
  if (finished.empty()) return finished;
  std::erase_if(running_, [this](const Request* r) {
    if (!r->is_finished()) return false;
    LeaveRunning(r);
    return true;
  });
  for (const FinishedRequest& f : finished) {
    Retire(requests_.at(f.id).get(), f.reason);
  }
  return finished;
}

void Scheduler::DropOutOfWindow(Request& r) {
  if (r.kv_window_.heavy_hitters()) return DropHeavyHitters(r);
  const int32_t bs = config_.block_size;
  const auto [first, count] = BlocksOutOfWindow(
      r.kv_window_, r.num_computed_tokens_, r.kv_dropped_tokens_, bs);
  if (count == 0) return;
  kv_.DropBlocks(r.id(), first, count);
  r.kv_dropped_tokens_ += count * bs;
  r.kv_stats_.dropped_tokens += int64_t{count} * bs;
  num_dropped_blocks_total_ += count;
}

void Scheduler::DropHeavyHitters(Request& r) {
  const int32_t bs = config_.block_size;
  std::vector<float>& mass = r.kv_block_mass_;
  std::vector<float>& seen = r.kv_block_seen_;
  mass.resize(kv_.GetBlockTable(r.id()).size(), 0.0f);
  seen.resize(mass.size(), 0.0f);
  const std::vector<int32_t> drops = HeavyHitterDrops(
      r.kv_window_, r.kv_tokens(), MeanAttention(mass, seen), bs);
  for (const int32_t b : drops) {  // highest first: the rest stay valid
    kv_.DropBlocks(r.id(), b, 1);
    mass.erase(mass.begin() + b);
    seen.erase(seen.begin() + b);
  }
  const int32_t count = static_cast<int32_t>(drops.size());
  r.kv_dropped_tokens_ += count * bs;
  r.kv_stats_.dropped_tokens += int64_t{count} * bs;
  num_dropped_blocks_total_ += count;
}

void Scheduler::AddBlockMass(const SchedulerOutput& output,
                             absl::Span<const float> mass, int32_t stride) {
  for (size_t i = 0; i < output.scheduled.size(); ++i) {
    const ScheduledRequest& s = output.scheduled[i];
    if (!s.track_mass || (i + 1) * stride > mass.size()) continue;
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;
    std::vector<float>& sums = it->second->kv_block_mass_;
    std::vector<float>& seen = it->second->kv_block_seen_;
    const int32_t n = std::min(s.num_blocks, stride);
    if (static_cast<int32_t>(sums.size()) < n) sums.resize(n, 0.0f);
    seen.resize(sums.size(), 0.0f);
    for (int32_t b = 0; b < n; ++b) {
      sums[b] += mass[i * stride + b];
      seen[b] += static_cast<float>(s.num_new_tokens);
    }
  }
}

void Scheduler::CachePartialBlock(const Request& r) {
  // A shared scope matches whole blocks only: its tails are never read.
  if (!config_.enable_prefix_caching || !reservation_->SharesPrefixes() ||
      r.scope_shared_) {
    return;
  }
  kv_.CachePartialBlock(r.id(), r.tokens(), r.num_computed_tokens_,
                        r.cache_ns_);
}

void Scheduler::CacheComputedBlocks(const Request& r) {
  if (!config_.enable_prefix_caching) return;
  kv_.CacheComputedBlocks(r.id(), r.tokens(), r.num_computed_tokens(),
                          r.cache_ns_);
}

const Request* Scheduler::GetRequest(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

std::vector<RequestId> Scheduler::RunningIds() const {
  std::vector<RequestId> ids;
  ids.reserve(running_.size());
  for (const Request* r : running_) ids.push_back(r->id());
  return ids;
}

std::vector<RequestId> Scheduler::WaitingIds() const {
  std::vector<RequestId> ids;
  ids.reserve(waiting_.size());
  for (const auto& [key, r] : waiting_) ids.push_back(r->id());
  return ids;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_running = num_running();
  s.num_waiting = num_waiting();
  s.num_waiting_seqs = static_cast<int32_t>(fair_.waiting_seats());
  s.kv = kv_.Usage();
  s.num_steps = num_steps_;
  s.num_preemptions_total = num_preemptions_total_;
  s.num_preemptions_swap_total = num_preemptions_swap_total_;
  s.num_priority_preemptions_recompute_total =
      num_priority_preemptions_recompute_total_;
  s.num_priority_preemptions_swap_total = num_priority_preemptions_swap_total_;
  s.num_preemptions_recompute_total =
      num_preemptions_total_ - num_preemptions_swap_total_;
  s.num_preempted_tokens_total = num_preempted_tokens_total_;
  s.num_recomputed_tokens_total = num_preempted_tokens_total_;
  s.num_swapped_out_blocks_total = num_swapped_out_blocks_total_;
  s.num_swapped_in_blocks_total = num_swapped_in_blocks_total_;
  s.swap_slots_used = s.kv.swap_slots_used;
  s.swap_slots_total = s.kv.swap_slots_total;
  s.num_copied_blocks_total = num_copied_blocks_total_;
  s.num_tail_hits_total = num_tail_copies_total_;
  s.num_dropped_blocks_total = num_dropped_blocks_total_;
  s.prefix_cache_uncacheable_tokens = prefix_cache_uncacheable_tokens_;
  s.num_scheduled_tokens_total = num_scheduled_tokens_total_;
  s.num_finished_total = num_finished_total_;
  s.num_aborted_total = num_aborted_total_;
  s.prefix_cache_queries_tokens = prefix_cache_queries_tokens_;
  s.prefix_cache_hit_tokens = prefix_cache_hit_tokens_;
  s.last_admission_stop = last_admission_stop_;
  return s;
}

absl::Status Scheduler::CheckInvariants() const {
  KV_RETURN_IF_ERROR(kv_.CheckInvariants());
  auto fail = [](const Request& r, absl::string_view what) {
    return absl::InternalError(absl::StrCat(
        "request ", r.id(), " (", RequestStatusName(r.status()), ", computed ",
        r.num_computed_tokens(), "/", r.num_tokens(), "): ", what));
  };
  if (requests_.size() != running_.size() + waiting_.size() ||
      kv_.num_requests() != static_cast<int32_t>(running_.size())) {
    return absl::InternalError(absl::StrCat(
        requests_.size(), " live, ", running_.size(), " running, ",
        waiting_.size(), " waiting, ", kv_.num_requests(), " with blocks"));
  }
  int32_t swapped = 0;
  int32_t seats = 0;
  absl::flat_hash_set<RequestId> seen;
  for (const Request* r : running_) {
    seats += r->seats();
    const int64_t blocks =
        static_cast<int64_t>(kv_.GetBlockTable(r->id()).size());
    if (!seen.insert(r->id()).second) return fail(*r, "running twice");
    if (r->status() != RequestStatus::kRunning) return fail(*r, "bad status");
    if (GetRequest(r->id()) != r) return fail(*r, "not in the id map");
    if (r->num_computed_tokens() > r->num_tokens() ||
        r->num_output_tokens() > r->max_tokens()) {
      return fail(*r, "token counts out of range");
    }
    const int64_t expected = reservation_->HeldBlocks(r->kv_tokens());
    if (blocks != expected) {
      return fail(*r, absl::StrCat("holds ", blocks, " blocks"));
    }
  }
  int64_t waiting_seats = 0;
  for (const auto& [key, r] : waiting_) {
    waiting_seats += r->seats();
    if (!seen.insert(r->id()).second) return fail(*r, "listed twice");
    if (r->status() != RequestStatus::kWaiting &&
        r->status() != RequestStatus::kPreempted) {
      return fail(*r, "bad status");
    }
    if (GetRequest(r->id()) != r || !(key == r->queue_key_)) {
      return fail(*r, "bad queue entry");
    }
    if (!kv_.GetBlockTable(r->id()).empty()) {
      return fail(*r, "waiting with KV blocks");
    }
    const int32_t slots = kv_.num_swapped_blocks(r->id());
    if (slots > 0) ++swapped;
    const int64_t expected =
        kvcache::BlocksForTokens(r->kv_tokens(), config_.block_size);
    if (slots != expected ||
        (slots > 0 && r->status() != RequestStatus::kPreempted)) {
      return fail(*r, absl::StrCat("waiting with ", slots, " swap slots"));
    }
  }
  if (seats != fair_.running_seats() ||
      waiting_seats != fair_.waiting_seats()) {
    return absl::InternalError(
        absl::StrCat("running requests hold ", seats, " seats, waiting ones ",
                     waiting_seats, "; fair share counts ",
                     fair_.running_seats(), " and ", fair_.waiting_seats()));
  }
  if (swapped != kv_.num_swapped_requests()) {
    return absl::InternalError(absl::StrCat(
        kv_.num_swapped_requests(), " swapped in KV, ", swapped, " waiting"));
  }
  return absl::OkStatus();
}

}  // namespace kvserve::scheduler
