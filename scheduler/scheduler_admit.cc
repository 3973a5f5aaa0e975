// Scheduler: admission of waiting requests (new, recompute-preempted and
// swapped out), cache-aware ordering, the high watermark and the thrash
// guard. See scheduler.h for the step's contract.
#include <algorithm>

#include "common/check.h"
#include "kvcache/kv_sizing.h"
#include "scheduler/scheduler.h"

namespace kvserve::scheduler {

void Scheduler::AdmitWaiting(StepPlan& plan) {
  kvcache::PrefixMatch match;
  while (true) {
    Request* r = nullptr;
    const AdmissionStop stop = NextAdmission(plan, &r, &match);
    if (stop != AdmissionStop::kNone) {
      last_admission_stop_ = stop;
      return;
    }
    const int32_t start = std::max(match.num_tokens, r->num_computed_tokens_);
    // kCacheAware: the head of the tenant's queue was passed over.
    Request* head = fair_.Waiting(r->tenant_id_).begin()->second;
    if (head != r) ++head->times_passed_;
    Admit(r, match, NumNewTokens(*r, start, plan.budget), plan);
  }
}

void Scheduler::Admit(Request* r, const kvcache::PrefixMatch& match, int32_t n,
                      StepPlan& plan) {
  const int32_t swapped = kv_.num_swapped_blocks(r->id());
  if (swapped > 0) {
    // Readmission after a swap: its KV comes back; it keeps its computed
    // tokens and does no prefix lookup.
    KV_CHECK(kv_.SwapIn(r->id(), &plan.swap_in), "swap-in failed");
    num_swapped_in_blocks_total_ += swapped;
    r->kv_stats_.swapped_in_blocks += swapped;
    KV_CHECK(kv_.Allocate(r->id(), AdmissionTokens(r->kv_tokens(), n),
                          kvcache::EvictReason::kAdmit)
                 .has_value(),
             "admission passed but Allocate failed");
  } else {
    const size_t copies_before = plan.copies.size();
    const auto fresh = kv_.AllocateWithPrefix(
        r->id(), match, AdmissionTokens(match.num_tokens, n), &plan.copies);
    KV_CHECK(fresh.has_value(), "admission passed but Allocate failed");
    // A cached tail arrives by copy, before this step's forward.
    plan.copy_owners.resize(plan.copies.size(), r);
    num_tail_copies_total_ +=
        static_cast<int64_t>(plan.copies.size() - copies_before);
    const bool first = r->num_preemptions_ == 0;
    r->num_computed_tokens_ = match.num_tokens;
    if (first) r->num_cached_tokens_ = match.num_tokens;
    if (config_.enable_prefix_caching) {
      prefix_cache_queries_tokens_ += r->num_tokens();
      prefix_cache_hit_tokens_ += match.num_tokens;
      if (first) {
        prefix_cache_uncacheable_tokens_ +=
            r->num_prompt_tokens() % config_.block_size;
      }
    }
  }
  Dequeue(r);
  r->status_ = RequestStatus::kRunning;
  r->admit_seq_ = next_admit_seq_++;
  NotePeakBlocks(*r);
  AddRunning(r);
  plan.scheduled.emplace_back(r, n);
  plan.budget -= n;
  // A first chunk the budget cut may grow if the step has tokens left.
  const int32_t want =
      NumNewTokens(*r, r->num_computed_tokens_, config_.max_num_batched_tokens);
  if (want > n) plan.prefill_want.emplace_back(r, want);
}

kvcache::PrefixMatch Scheduler::MatchPrefix(const Request& r) const {
  // NOTE: contiguous slabs share nothing: kMaxLength matches no prefix. A
  // swapped-out request brings its own KV back.
  if (!config_.enable_prefix_caching || !reservation_->SharesPrefixes() ||
      r.num_computed_tokens_ > 0) {
    return kvcache::PrefixMatch();
  }
  return kv_.FindCachedPrefix(r.tokens(), r.cache_ns_, !r.scope_shared_);
}

Request* Scheduler::PickCacheAware(Request* head,
                                   kvcache::PrefixMatch* match) const {
  Request* best = head;
  *match = MatchPrefix(*best);
  // Preempted requests keep the head (they are in FCFS order before every
  // never-admitted one); with caching off there is nothing to rank by; a
  // head passed over often enough goes now.
  if (best->status_ != RequestStatus::kWaiting ||
      !config_.enable_prefix_caching || !reservation_->SharesPrefixes() ||
      head->times_passed_ >= kCacheAwareMaxPasses) {
    return best;
  }
  const auto& queue = fair_.Waiting(head->tenant_id_);
  int32_t looked = 1;
  for (auto it = std::next(queue.begin());
       it != queue.end() && looked < kCacheAwareWindow; ++it, ++looked) {
    Request* r = it->second;
    if (r->priority() != best->priority()) break;
    kvcache::PrefixMatch m = MatchPrefix(*r);
    if (m.num_tokens > match->num_tokens) {
      best = r;
      *match = std::move(m);
    }
  }
  return best;
}

AdmissionStop Scheduler::NextAdmission(const StepPlan& plan, Request** next,
                                       kvcache::PrefixMatch* match) const {
  if (waiting_.empty()) return AdmissionStop::kQueueEmpty;
  Request* head = AdmissionCandidate();
  if (head == nullptr) return AdmissionStop::kTenantCap;
  if (fair_.running_seats() + head->seats() > config_.max_num_seqs) {
    return AdmissionStop::kMaxNumSeqs;
  }
  if (plan.budget <= 0) return AdmissionStop::kTokenBudget;
  if (kv_.pool().num_active() >
      config_.admission_high_watermark * kv_.num_blocks()) {
    return AdmissionStop::kHighWatermark;
  }
  // NOTE: strict queue order: a head that does not fit blocks the rest, so
  // large requests are not starved by small ones behind them.
  if (config_.policy == SchedulingPolicy::kCacheAware) {
    head = PickCacheAware(head, match);
    if (fair_.running_seats() + head->seats() > config_.max_num_seqs) {
      return AdmissionStop::kMaxNumSeqs;
    }
    if (!fair_.UnderCap(head->tenant_id_, head->seats())) {
      return AdmissionStop::kTenantCap;
    }
  } else {
    *match = MatchPrefix(*head);
  }
  *next = head;
  const int32_t start = std::max(match->num_tokens, head->num_computed_tokens_);
  const int32_t n = NumNewTokens(*head, start, plan.budget);
  if (config_.thrash_preemption_limit > 0 &&
      head->consecutive_preemptions_ >= config_.thrash_preemption_limit &&
      !RemainingPrefillFits(*head, *match, start, n, plan)) {
    return AdmissionStop::kThrashGuard;
  }
  // A swapped-out request under a KvWindow gets back its kept tokens only.
  return CanAdmit(*match, start - head->kv_dropped_tokens_, n)
             ? AdmissionStop::kNone
             : AdmissionStop::kKvBlocks;
}

bool Scheduler::RemainingPrefillFits(const Request& r,
                                     const kvcache::PrefixMatch& match,
                                     int32_t start, int32_t n,
                                     const StepPlan& plan) const {
  const int32_t remaining = r.num_tokens() - start;
  // The step budget: all of it this step, unless no step could take it all
  // (then only KV decides, or it would wait forever).
  int32_t step_max = config_.max_num_batched_tokens;
  if (config_.long_prefill_token_threshold > 0) {
    step_max = std::min(step_max, config_.long_prefill_token_threshold);
  }
  if (n < remaining && remaining <= step_max) return false;
  // KV: blocks for every remaining token at once.
  int64_t tokens = AdmissionTokens(start - r.kv_dropped_tokens_, remaining);
  if (r.kv_window_.enabled()) {
    tokens = std::min<int64_t>(tokens, config_.max_model_len);
  }
  if (kv_.num_swapped_blocks(r.id()) > 0) {
    return kvcache::BlocksForTokens(tokens, config_.block_size) <=
           int64_t{kv_.num_free_blocks()} - watermark_blocks_;
  }
  return kv_.CanAllocateWithPrefix(match, tokens, watermark_blocks_);
}

bool Scheduler::CanAdmit(const kvcache::PrefixMatch& match, int32_t start,
                         int32_t n) const {
  // A swapped-out request has an empty match: all its blocks are fresh. A
  // slab (kMaxLength) is all a request ever needs.
  return kv_.CanAllocateWithPrefix(match, AdmissionTokens(start, n),
                                   watermark_blocks_);
}

}  // namespace kvserve::scheduler
