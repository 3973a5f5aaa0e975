#include "scheduler/scheduler.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::scheduler {
namespace {

const SchedulerConfig& ValidConfig(const SchedulerConfig& config) {
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
      watermark_blocks_(config.watermark_blocks()),
      kv_(config.num_blocks, config.block_size) {}

absl::Status Scheduler::AddRequest(std::unique_ptr<Request> request) {
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
  r->cache_ns_ = kvcache::NamespaceHash(config_.model_id, r->cache_salt());
  requests_.emplace(r->id(), std::move(request));
  Enqueue(r, /*at_head=*/false);
  return absl::OkStatus();
}

absl::Status Scheduler::CheckRequest(const Request& r) const {
  if (r.num_prompt_tokens() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", r.id(), ": prompt is empty"));
  }
  if (r.max_tokens() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", r.id(), ": max_tokens must be >= 1, got ", r.max_tokens()));
  }
  if (requests_.contains(r.id())) {
    return absl::AlreadyExistsError(
        absl::StrCat("request ", r.id(), " already exists"));
  }
  const int64_t total = int64_t{r.num_prompt_tokens()} + r.max_tokens();
  if (total > config_.max_model_len) {
    return absl::OutOfRangeError(
        absl::StrCat("request ", r.id(), ": prompt (", r.num_prompt_tokens(),
                     " tokens) + max_tokens (", r.max_tokens(), ") = ", total,
                     " tokens exceeds max_model_len ", config_.max_model_len));
  }
  const int64_t blocks =
      config_.kv_reservation == KvReservation::kMaxLength
          ? config_.slab_blocks()
          : kvcache::BlocksForTokens(total, config_.block_size);
  const int64_t usable = config_.num_blocks - watermark_blocks_;
  if (blocks > usable) {
    return absl::OutOfRangeError(
        absl::StrCat("request ", r.id(), ": prompt + max_tokens = ", total,
                     " tokens need ", blocks, " KV blocks of ",
                     config_.block_size, " tokens, but the pool has ",
                     config_.num_blocks, " blocks (", watermark_blocks_,
                     " kept free by the watermark, ", usable, " usable)"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::Finish(RequestId id, FinishReason reason) {
  auto it = requests_.find(id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("request ", id, " is not live"));
  }
  Request* r = it->second.get();
  if (r->status_ == RequestStatus::kRunning) {
    auto pos = std::find(running_.begin(), running_.end(), r);
    KV_CHECK(pos != running_.end(), "request ", id, " running but unlisted");
    running_.erase(pos);
  } else {
    KV_CHECK(waiting_.erase(r->queue_key_) == 1, "request ", id,
             " status=", RequestStatusName(r->status_), " not queued");
  }
  Retire(r, reason);
  return absl::OkStatus();
}

void Scheduler::Retire(Request* r, FinishReason reason) {
  kv_.Free(r->id());
  switch (reason) {
    case FinishReason::kStop:
      r->status_ = RequestStatus::kFinishedStopped;
      break;
    case FinishReason::kLength:
      r->status_ = RequestStatus::kFinishedLength;
      break;
    case FinishReason::kAbort:
      r->status_ = RequestStatus::kFinishedAborted;
      ++num_aborted_total_;
      break;
  }
  ++num_finished_total_;
  const RequestId id = r->id();
  requests_.erase(id);  // destroys *r
}

void Scheduler::Enqueue(Request* r, bool at_head) {
  if (config_.policy == SchedulingPolicy::kPriority) {
    // NOTE: a preempted request keeps its arrival key: among its priority it
    // precedes every later arrival, which is the head for it.
    r->queue_key_ = {r->priority(), r->arrival_seq(), r->id()};
  } else {
    r->queue_key_ = {0, at_head ? next_head_order_-- : r->arrival_seq(),
                     r->id()};
  }
  KV_CHECK(waiting_.emplace(r->queue_key_, r).second, "request ", r->id(),
           " queued twice");
}

SchedulerOutput Scheduler::Schedule() {
  KV_CHECK(!pending_update_, "Schedule() before UpdateFromOutput() of step ",
           num_steps_ - 1);
  StepPlan plan;
  plan.budget = config_.max_num_batched_tokens;
  plan.scheduled.reserve(running_.size() + 8);
  ScheduleRunning(plan);
  if (plan.preempted.empty()) {
    AdmitWaiting(plan);
  } else {
    last_admission_stop_ = AdmissionStop::kPreempted;
  }
  SchedulerOutput out = BuildOutput(plan);
  pending_update_ = !out.scheduled.empty();
  ++num_steps_;
  return out;
}

int32_t Scheduler::NumNewTokens(const Request& r, int32_t computed,
                                int32_t budget) const {
  int32_t n = r.num_tokens() - computed;
  if (config_.long_prefill_token_threshold > 0) {
    n = std::min(n, config_.long_prefill_token_threshold);
  }
  return std::min(n, budget);
}

void Scheduler::ScheduleRunning(StepPlan& plan) {
  size_t i = 0;
  while (i < running_.size() && plan.budget > 0) {
    Request* r = running_[i];
    const int32_t n = NumNewTokens(*r, plan.budget);
    KV_CHECK(n > 0, "running request ", r->id(), " has nothing to compute");
    if (!AllocateOrPreempt(&i, n, plan)) continue;  // running_[i] moved on
    plan.scheduled.emplace_back(r, n);
    plan.budget -= n;
    ++i;
  }
}

bool Scheduler::AllocateOrPreempt(size_t* index, int32_t n, StepPlan& plan) {
  Request* r = running_[*index];
  while (!kv_.Allocate(r->id(), int64_t{r->num_computed_tokens()} + n)) {
    const size_t victim = PickVictim();
    const bool self = running_[victim] == r;
    Preempt(victim, plan);
    if (self) return false;
    if (victim < *index) --*index;
  }
  return true;
}

size_t Scheduler::PickVictim() const {
  KV_CHECK(!running_.empty());
  if (config_.policy == SchedulingPolicy::kFcfs) return running_.size() - 1;
  size_t best = 0;
  for (size_t i = 1; i < running_.size(); ++i) {
    const Request& a = *running_[i];
    const Request& b = *running_[best];
    if (std::pair(a.priority(), a.admit_seq_) >
        std::pair(b.priority(), b.admit_seq_)) {
      best = i;
    }
  }
  return best;
}

void Scheduler::Preempt(size_t index, StepPlan& plan) {
  Request* r = running_[index];
  running_.erase(running_.begin() + index);
  // A victim already planned this step (priority policy) gives its tokens
  // back to the budget.
  auto planned = std::find_if(plan.scheduled.begin(), plan.scheduled.end(),
                              [r](const auto& p) { return p.first == r; });
  if (planned != plan.scheduled.end()) {
    plan.budget += planned->second;
    plan.scheduled.erase(planned);
  }
  kv_.Free(r->id());
  num_preempted_tokens_total_ += r->num_computed_tokens_;
  ++num_preemptions_total_;
  ++r->num_preemptions_;
  r->num_computed_tokens_ = 0;  // recompute prompt + output on readmission
  r->status_ = RequestStatus::kPreempted;
  Enqueue(r, /*at_head=*/true);
  plan.preempted.push_back(r->id());
}

void Scheduler::AdmitWaiting(StepPlan& plan) {
  int64_t reserved_blocks = -1;  // kGuaranteedNoEvict: computed lazily
  kvcache::PrefixMatch match;
  while (true) {
    const AdmissionStop stop = NextAdmission(plan, &reserved_blocks, &match);
    if (stop != AdmissionStop::kNone) {
      last_admission_stop_ = stop;
      return;
    }
    auto head = waiting_.begin();
    Request* r = head->second;
    const int32_t n = NumNewTokens(*r, match.num_tokens, plan.budget);
    const auto fresh =
        kv_.AllocateWithPrefix(r->id(), match, AdmissionTokens(match, n));
    KV_CHECK(fresh.has_value(), "admission passed but Allocate failed");
    r->num_computed_tokens_ = match.num_tokens;
    if (r->num_preemptions_ == 0) r->num_cached_tokens_ = match.num_tokens;
    if (config_.enable_prefix_caching) {
      prefix_cache_queries_tokens_ += r->num_tokens();
      prefix_cache_hit_tokens_ += match.num_tokens;
    }
    waiting_.erase(head);
    r->status_ = RequestStatus::kRunning;
    r->admit_seq_ = next_admit_seq_++;
    running_.push_back(r);
    plan.scheduled.emplace_back(r, n);
    plan.budget -= n;
    if (reserved_blocks >= 0) reserved_blocks += FutureBlocks(*r);
  }
}

AdmissionStop Scheduler::NextAdmission(const StepPlan& plan,
                                       int64_t* reserved_blocks,
                                       kvcache::PrefixMatch* match) const {
  if (waiting_.empty()) return AdmissionStop::kQueueEmpty;
  if (static_cast<int32_t>(running_.size()) >= config_.max_num_seqs) {
    return AdmissionStop::kMaxNumSeqs;
  }
  if (plan.budget <= 0) return AdmissionStop::kTokenBudget;
  // NOTE: strict queue order: a head that does not fit blocks the rest, so
  // large requests are not starved by small ones behind them.
  const Request& head = *waiting_.begin()->second;
  // NOTE: contiguous slabs share nothing: kMaxLength matches no prefix.
  const bool match_prefix = config_.enable_prefix_caching &&
                            config_.kv_reservation == KvReservation::kPaged;
  *match = match_prefix ? kv_.FindCachedPrefix(head.tokens(), head.cache_ns_)
                        : kvcache::PrefixMatch();
  const int32_t n = NumNewTokens(head, match->num_tokens, plan.budget);
  return CanAdmit(head, *match, n, reserved_blocks) ? AdmissionStop::kNone
                                                    : AdmissionStop::kKvBlocks;
}

// Blocks `r` may still allocate before it reaches prompt + max_tokens.
int64_t Scheduler::FutureBlocks(const Request& r) const {
  const int64_t total = int64_t{r.num_prompt_tokens()} + r.max_tokens();
  return kvcache::BlocksForTokens(total, config_.block_size) -
         static_cast<int64_t>(kv_.GetBlockTable(r.id()).size());
}

int64_t Scheduler::AdmissionTokens(const kvcache::PrefixMatch& match,
                                   int32_t n) const {
  if (config_.kv_reservation == KvReservation::kMaxLength) {
    return config_.slab_blocks() * config_.block_size;
  }
  return int64_t{match.num_tokens} + n;
}

bool Scheduler::CanAdmit(const Request& r, const kvcache::PrefixMatch& match,
                         int32_t n, int64_t* reserved_blocks) const {
  const int64_t tokens = AdmissionTokens(match, n);
  // A slab is all a request ever needs: nothing more to reserve.
  if (config_.admission == AdmissionPolicy::kMaxUtilization ||
      config_.kv_reservation == KvReservation::kMaxLength) {
    return kv_.CanAllocateWithPrefix(match, tokens, watermark_blocks_);
  }
  if (*reserved_blocks < 0) {
    *reserved_blocks = 0;
    for (const Request* running : running_) {
      *reserved_blocks += FutureBlocks(*running);
    }
  }
  // Matched blocks other requests hold cost no free block; evictable ones do.
  const int64_t shared =
      static_cast<int64_t>(match.blocks.size()) - match.num_evictable;
  return int64_t{kv_.num_free_blocks()} - *reserved_blocks -
             (FutureBlocks(r) - shared) >=
         watermark_blocks_;
}

SchedulerOutput Scheduler::BuildOutput(StepPlan& plan) {
  SchedulerOutput out;
  out.step = num_steps_;
  out.scheduled.reserve(plan.scheduled.size());
  out.token_ids.reserve(config_.max_num_batched_tokens - plan.budget);
  out.block_ids.reserve(block_ids_hint_);
  for (const auto& [r, n] : plan.scheduled) {
    ScheduledRequest& s = out.scheduled.emplace_back();
    s.id = r->id();
    s.start_position = r->num_computed_tokens_;
    s.num_new_tokens = n;
    s.token_offset = static_cast<int32_t>(out.token_ids.size());
    AppendTokens(*r, s.start_position, n, out.token_ids);
    r->num_computed_tokens_ += n;
    s.produces_token = r->num_computed_tokens_ == r->num_tokens();
    const std::vector<kvcache::BlockId>& table = kv_.GetBlockTable(r->id());
    s.block_offset = static_cast<int32_t>(out.block_ids.size());
    s.num_blocks = static_cast<int32_t>(table.size());
    out.block_ids.insert(out.block_ids.end(), table.begin(), table.end());
  }
  out.total_num_tokens = static_cast<int32_t>(out.token_ids.size());
  out.preempted = std::move(plan.preempted);
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
    const SchedulerOutput& output, absl::Span<const int32_t> sampled) {
  KV_CHECK(output.empty() || (pending_update_ && output.step == num_steps_ - 1),
           "UpdateFromOutput of step ", output.step, ", latest is ",
           num_steps_ - 1);
  pending_update_ = false;
  std::vector<FinishedRequest> finished;
  size_t k = 0;
  for (const ScheduledRequest& s : output.scheduled) {
    int32_t token = 0;
    if (s.produces_token) {
      KV_CHECK(k < sampled.size(), "sampled has ", sampled.size(), " tokens");
      token = sampled[k++];
    }
    auto it = requests_.find(s.id);
    // Finished (e.g. aborted) since Schedule(): drop its token.
    if (it == requests_.end()) continue;
    Request* r = it->second.get();
    if (r->status_ != RequestStatus::kRunning) continue;
    // Its KV of this step is written now: register its full blocks.
    CacheComputedBlocks(*r);
    if (!s.produces_token) continue;
    r->output_.push_back(token);
    if (r->num_output_tokens() >= r->max_tokens()) {
      r->status_ = RequestStatus::kFinishedLength;
      finished.push_back({r->id(), FinishReason::kLength});
    }
  }
  KV_CHECK(k == sampled.size(), "sampled has ", sampled.size(),
           " tokens, output produces ", k);
  if (finished.empty()) return finished;
  std::erase_if(running_, [](const Request* r) { return r->is_finished(); });
  for (const FinishedRequest& f : finished) {
    Retire(requests_.at(f.id).get(), f.reason);
  }
  return finished;
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
  s.kv = kv_.Usage();
  s.num_steps = num_steps_;
  s.num_preemptions_total = num_preemptions_total_;
  s.num_preempted_tokens_total = num_preempted_tokens_total_;
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
  if (static_cast<int32_t>(running_.size()) > config_.max_num_seqs) {
    return absl::InternalError(absl::StrCat(running_.size(), " running"));
  }
  if (requests_.size() != running_.size() + waiting_.size() ||
      kv_.num_requests() != static_cast<int32_t>(running_.size())) {
    return absl::InternalError(absl::StrCat(
        requests_.size(), " live, ", running_.size(), " running, ",
        waiting_.size(), " waiting, ", kv_.num_requests(), " with blocks"));
  }
  absl::flat_hash_set<RequestId> seen;
  for (const Request* r : running_) {
    const int64_t blocks =
        static_cast<int64_t>(kv_.GetBlockTable(r->id()).size());
    if (!seen.insert(r->id()).second) return fail(*r, "running twice");
    if (r->status() != RequestStatus::kRunning) return fail(*r, "bad status");
    if (GetRequest(r->id()) != r) return fail(*r, "not in the id map");
    if (r->num_computed_tokens() > r->num_tokens() ||
        r->num_output_tokens() > r->max_tokens()) {
      return fail(*r, "token counts out of range");
    }
    const int64_t expected =
        config_.kv_reservation == KvReservation::kMaxLength
            ? config_.slab_blocks()
            : kvcache::BlocksForTokens(r->num_computed_tokens(),
                                       config_.block_size);
    if (blocks != expected) {
      return fail(*r, absl::StrCat("holds ", blocks, " blocks"));
    }
  }
  for (const auto& [key, r] : waiting_) {
    if (!seen.insert(r->id()).second) return fail(*r, "listed twice");
    if (r->status() != RequestStatus::kWaiting &&
        r->status() != RequestStatus::kPreempted) {
      return fail(*r, "bad status");
    }
    if (GetRequest(r->id()) != r || !(key == r->queue_key_)) {
      return fail(*r, "bad queue entry");
    }
    if (r->num_computed_tokens() != 0 || !kv_.GetBlockTable(r->id()).empty()) {
      return fail(*r, "waiting with KV");
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::scheduler
