// Scheduler: KV growth of running requests (speculative drafts included),
// copy-on-write, preemption (recompute or swap) and forks. See scheduler.h for
// the step's contract.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/status_macros.h"
#include "kvcache/kv_sizing.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {

bool Scheduler::AllocateOrPreempt(size_t* index, int32_t n, StepPlan& plan) {
  Request* r = running_[*index];
  const int32_t computed = r->kv_tokens();
  const size_t copies_before = plan.copies.size();
  while (!kv_.AllocateForWrite(r->id(), computed, int64_t{computed} + n,
                               &plan.copies)) {
    const size_t victim = victims_->ForKv(running_);
    const bool self = running_[victim] == r;
    Preempt(victim, plan);
    if (self) return false;
    if (victim < *index) --*index;
  }
  for (size_t i = copies_before; i < plan.copies.size(); ++i) {
    plan.copy_owners.push_back(r);
    ++num_copied_blocks_total_;
  }
  NotePeakBlocks(*r);
  return true;
}

int32_t Scheduler::DraftTokens(const Request& r, int64_t budget) const {
  int64_t k = std::min<int64_t>({static_cast<int64_t>(r.draft_.size()), budget,
                                 r.max_tokens() - r.num_output_tokens() - 1});
  if (k <= 0) return 0;
  // A draft never preempts, evicts a cached block or dips into the
  // watermark: past the blocks its last token needs, it takes only blocks
  // that are free and hold nothing, else it stops where they end.
  const int32_t bs = config_.block_size;
  const int64_t last = r.kv_tokens() + 1;  // KV tokens with its last token
  const int64_t spare = kv_.pool().num_free() -
                        kv_.pool().num_cached_evictable() - watermark_blocks_;
  const int64_t extra = kvcache::BlocksForTokens(last + k, bs) -
                        kvcache::BlocksForTokens(last, bs);
  if (extra > spare) {
    k = std::min<int64_t>(k, kvcache::BlocksForTokens(last, bs) * bs - last);
  }
  return static_cast<int32_t>(k);
}

void Scheduler::SetDraft(RequestId id, std::vector<int32_t> draft) {
  owner_.CheckOwner("Scheduler");
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->kv_window_.enabled() ||
      it->second->status_ != RequestStatus::kRunning) {
    return;
  }
  it->second->draft_ = std::move(draft);
}

bool Scheduler::PriorityPreemptionHelps(const Request& head) const {
  // Blocks that preempting every request that may be its victim frees: the
  // ones only it holds.
  int64_t freed = 0;
  for (const Request* r : running_) {
    if (!MayPreemptFor(*r, head)) continue;
    for (const kvcache::BlockId b : kv_.GetBlockTable(r->id())) {
      if (kv_.pool().ref_count(b) == 1) ++freed;
    }
  }
  const int64_t active = kv_.pool().num_active() - freed;
  if (active > config_.admission_high_watermark * kv_.num_blocks()) {
    return false;
  }
  // The head's first chunk, as admission would size it (its cached prefix
  // ignored: an upper bound).
  const int32_t start = head.num_computed_tokens_;
  const int32_t n = NumNewTokens(head, start, config_.max_num_batched_tokens);
  const int64_t need = kvcache::BlocksForTokens(
      AdmissionTokens(head.kv_tokens(), n), config_.block_size);
  return kv_.num_free_blocks() + freed - need >= watermark_blocks_;
}

void Scheduler::NotePeakBlocks(Request& r) {
  r.kv_stats_.peak_blocks =
      std::max(r.kv_stats_.peak_blocks,
               static_cast<int32_t>(kv_.GetBlockTable(r.id()).size()));
}

void Scheduler::PreemptForPriority(StepPlan& plan) {
  // A step that swapped a request in swaps nothing out (a freed slot could
  // be reused before it is read): such a head waits one more step.
  if (!victims_->PreemptsForWaiting() || !plan.swap_in.empty()) {
    return;
  }
  while (last_admission_stop_ == AdmissionStop::kKvBlocks ||
         last_admission_stop_ == AdmissionStop::kHighWatermark) {
    const Request* head = AdmissionCandidate();
    if (head == nullptr || running_.empty()) return;
    const size_t victim = victims_->ForWaiting(
        running_, [&](const Request& r) { return MayPreemptFor(r, *head); },
        [this](const Request& r) { return Rank(r); });
    if (victim == running_.size()) return;
    if (plan.preempted.empty() && !PriorityPreemptionHelps(*head)) return;
    Preempt(victim, plan, PreemptReason::kPriority);
    // Nothing is admitted in a step that preempts (no step both swaps out
    // and swaps in): the head is admitted next step. Stop once it would fit.
    Request* next = nullptr;
    kvcache::PrefixMatch match;
    const AdmissionStop stop = NextAdmission(plan, &next, &match);
    last_admission_stop_ = stop == AdmissionStop::kNone || next != head
                               ? AdmissionStop::kPreempted
                               : stop;
  }
  if (!plan.preempted.empty()) last_admission_stop_ = AdmissionStop::kPreempted;
}

bool Scheduler::MayPreemptFor(const Request& r, const Request& head) const {
  return Rank(r) > Rank(head) && (r.tenant_id_ == head.tenant_id_ ||
                                  fair_.AtOrAboveShare(r.tenant_id_));
}

bool Scheduler::ChooseSwap(const Request& r, int32_t blocks) const {
  // NOTE: a slab (kMaxLength) is never preempted for KV; nothing computed
  // means nothing to save.
  if (blocks == 0 || !reservation_->Grows() ||
      config_.preemption_mode == PreemptionMode::kRecompute) {
    return false;
  }
  // Shared blocks are swapped like private ones (kvcache reads them, the
  // other holders keep them); only free slots matter. Otherwise: recompute.
  if (!kv_.CanSwapOut(r.id(), blocks)) return false;
  if (config_.preemption_mode == PreemptionMode::kSwap) return true;
  const double recompute =
      r.num_computed_tokens() * config_.recompute_seconds_per_token;
  const double swap = 2.0 * blocks * config_.swap_seconds_per_block;
  return swap < recompute;
}

void Scheduler::Preempt(size_t index, StepPlan& plan, PreemptReason reason) {
  Request* r = running_[index];
  running_.erase(running_.begin() + index);
  LeaveRunning(r);
  // A victim already planned this step (priority policy) gives its tokens
  // back to the budget.
  auto planned = std::find_if(plan.scheduled.begin(), plan.scheduled.end(),
                              [r](const auto& p) { return p.first == r; });
  if (planned != plan.scheduled.end()) {
    plan.budget += planned->second;
    plan.scheduled.erase(planned);
  }
  // Its copy-on-write of this step is void (the copy runs after swap-outs,
  // so its new block holds nothing yet: such a victim recomputes).
  bool copied = false;
  for (size_t i = plan.copy_owners.size(); i-- > 0;) {
    if (plan.copy_owners[i] != r) continue;
    plan.copies.erase(plan.copies.begin() + static_cast<ptrdiff_t>(i));
    plan.copy_owners.erase(plan.copy_owners.begin() +
                           static_cast<ptrdiff_t>(i));
    --num_copied_blocks_total_;
    copied = true;
  }
  const int32_t computed = r->num_computed_tokens_;
  const auto blocks = static_cast<int32_t>(
      kvcache::BlocksForTokens(r->kv_tokens(), config_.block_size));
  if (!copied && ChooseSwap(*r, blocks)) {
    // Blocks covering its computed tokens go to swap slots; blocks
    // allocated this step for planned tokens hold nothing and are dropped.
    kv_.SwapOut(r->id(), blocks, &plan.swap_out);
    num_swapped_out_blocks_total_ += blocks;
    ++num_preemptions_swap_total_;
    ++r->kv_stats_.preemptions_swap;
    r->kv_stats_.swapped_out_blocks += blocks;
    if (reason == PreemptReason::kPriority) {
      ++num_priority_preemptions_swap_total_;
    }
  } else {
    // Its readmission may hit its partial last block, unless that block is
    // a copy-on-write target whose copy was just voided (it holds nothing).
    if (!copied) CachePartialBlock(*r);
    kv_.Free(r->id());
    num_preempted_tokens_total_ += computed;
    r->num_computed_tokens_ = 0;  // recompute prompt + output on readmission
    r->kv_dropped_tokens_ = 0;
    r->kv_block_mass_.clear();
    r->kv_block_seen_.clear();
    ++r->kv_stats_.preemptions_recompute;
    r->kv_stats_.recomputed_tokens += computed;
    if (reason == PreemptReason::kPriority) {
      ++num_priority_preemptions_recompute_total_;
    }
  }
  ++num_preemptions_total_;
  ++r->num_preemptions_;
  ++r->consecutive_preemptions_;
  r->status_ = RequestStatus::kPreempted;
  Enqueue(r, /*at_head=*/true);
  plan.preempted.push_back(r->id());
}

absl::Status Scheduler::Fork(RequestId parent_id,
                             std::unique_ptr<Request> child) {
  owner_.CheckOwner("Scheduler");
  if (child == nullptr) return absl::InvalidArgumentError("fork: null child");
  auto it = requests_.find(parent_id);
  if (it == requests_.end() || it->second->status_ != RequestStatus::kRunning) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fork: parent request ", parent_id, " is not running (",
        it == requests_.end() ? "not live"
                              : RequestStatusName(it->second->status_),
        ")"));
  }
  if (pending_update_) {
    return absl::FailedPreconditionError(
        absl::StrCat("fork of request ", parent_id,
                     " between Schedule and "
                     "UpdateFromOutput of step ",
                     num_steps_ - 1));
  }
  Request* parent = it->second.get();
  KV_RETURN_IF_ERROR(CheckRequest(*child));
  const int32_t computed = parent->num_computed_tokens_;
  Request* c = child.get();
  if (c->num_tokens() <= computed ||
      c->num_output_tokens() >= c->max_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fork child ", c->id(), ": needs a token beyond the parent's ",
        computed, " computed ones and fewer than max_tokens (", c->max_tokens(),
        ") outputs; it has ", c->num_tokens(), " tokens, ",
        c->num_output_tokens(), " outputs"));
  }
  for (int32_t i = 0; i < computed; ++i) {
    if (c->token(i) != parent->token(i)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fork child ", c->id(), ": token ", i, " is ", c->token(i),
          ", parent ", parent_id, " has ", parent->token(i)));
    }
  }
  const auto shared = static_cast<int32_t>(
      kvcache::BlocksForTokens(parent->kv_tokens(), config_.block_size));
  if (shared > 0) kv_.Fork(parent_id, c->id(), shared);
  if (reservation_->ForkTokens() > 0 &&
      !kv_.Allocate(c->id(), reservation_->ForkTokens(),
                    kvcache::EvictReason::kAdmit)) {
    kv_.Free(c->id());
    return absl::ResourceExhaustedError(
        absl::StrCat("fork child ", c->id(), ": no free max-length slab of ",
                     config_.slab_blocks(), " blocks"));
  }
  c->arrival_seq_ = next_arrival_seq_++;
  c->cache_salt_ = parent->cache_salt_;
  c->cache_scope_ = parent->cache_scope_;
  c->scope_shared_ = parent->scope_shared_;
  c->cache_ns_ = parent->cache_ns_;
  c->tenant_ = parent->tenant_;
  c->tenant_id_ = fair_.Join(c->tenant_);
  c->pending_forks_ = 0;
  c->num_computed_tokens_ = computed;
  c->kv_window_ = parent->kv_window_;
  c->kv_dropped_tokens_ = parent->kv_dropped_tokens_;
  c->kv_block_mass_ = parent->kv_block_mass_;
  c->kv_block_seen_ = parent->kv_block_seen_;
  c->num_cached_tokens_ = parent->num_cached_tokens_;
  c->status_ = RequestStatus::kRunning;
  c->admit_seq_ = next_admit_seq_++;
  NotePeakBlocks(*c);
  // The child's seat is one the parent reserved for it, when it did.
  if (parent->pending_forks_ > 0) {
    --parent->pending_forks_;
    fair_.AddRunningSeats(parent->tenant_id_, -1);
  }
  AddRunning(c);
  requests_.emplace(c->id(), std::move(child));
  return absl::OkStatus();
}

void Scheduler::EndForks(RequestId parent_id) {
  owner_.CheckOwner("Scheduler");
  auto it = requests_.find(parent_id);
  if (it == requests_.end()) return;
  Request* p = it->second.get();
  if (p->status_ == RequestStatus::kRunning) {
    fair_.AddRunningSeats(p->tenant_id_, -p->pending_forks_);
  } else {
    fair_.AddWaitingSeats(-p->pending_forks_);
  }
  p->pending_forks_ = 0;
}

}  // namespace kvserve::scheduler
