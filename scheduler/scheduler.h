// Scheduler: continuous batching over a paged KV cache. It owns every live
// Request (waiting or running) and the KvCacheManager holding their blocks,
// and decides, step by step, which requests compute how many tokens. It runs
// no model, samples nothing, and sees no proto types: the engine turns a
// SchedulerOutput into a ForwardBatch and reports sampled tokens back.
//
// One step (`Schedule`), with no separate prefill and decode phases: each
// request's num_computed_tokens chases num_tokens() within a token budget.
//   1. Running requests: first every decode (one token left), in admission
//      order; then the prefill chunks, which share what is left: when a
//      short request waits (the short lane, step 2) up to half of it is
//      kept for that one; the rest is split among tenants by weight
//      (FairShare::SplitPrefill), first come first served within a tenant.
//      When one cannot get its blocks, the victim (FCFS: most recently
//      admitted; priority: largest priority value, then most recently admitted;
//      maybe itself) is preempted and returns to the head of the waiting queue,
//      by recompute (its blocks are freed, its computed tokens reset to 0;
//      its output tokens are kept and recomputed) or by swap (its computed
//      blocks are copied to host swap slots, blocks_to_swap_out, then freed;
//      it keeps its computed tokens). The mode: see PreemptionMode.
//      A request about to write into a shared block (ref > 1: a partially
//      filled last block after a Fork) first gets a private copy
//      (blocks_to_copy; copy-on-write).
//   2. Only if nothing was preempted: admit waiting requests in queue order
//      while max_num_seqs, the budget and KV (above the watermark) allow; a
//      long prompt gets a chunk of what the budget has left. Queue order is
//      per tenant (FairShare::Candidate): the next request is the first in
//      queue order among tenants under their cap, those below their share
//      of max_num_seqs first. Under kPriority and kCacheAware the order is
//      aged (SchedulerConfig::priority_aging_seconds). With prefix
//      caching, the head first matches its longest cached prefix (full
//      blocks, never its last token; a preempted request matches again): it
//      starts with num_computed_tokens = the matched tokens and only the rest
//      is scheduled; matched evictable blocks count against free blocks.
//      The short lane: while long prefills (more than
//      long_prefill_token_threshold tokens left, running or ahead in the
//      queue) would take the whole budget, the first short request among the
//      first kShortLaneWindow waiting ones (its rest within the threshold; its
//      tenant may run it) gets a small step: its tokens and as many for the
//      long prefills. It is admitted in order when it is the head, else
//      after normal admission stopped for the budget alone (it passes long
//      requests that wait only for budget, never one waiting for KV or
//      seats). So it waits at most the step in progress, and its own step
//      costs about twice its idle prefill. At most every other step is
//      such a step: long prefills keep at least half of the steps whole.
//      A swapped-out head gets fresh blocks for its slots (blocks_to_swap_in)
//      and continues where it stopped, without a prefix lookup. Admission
//      also stops above admission_high_watermark, and a thrashing head (see
//      thrash_preemption_limit) waits until its whole remaining prefill fits.
//      kCacheAware picks the head by longest cached prefix (bounded window).
//      kPriority: a head that does not fit (KV blocks or the high
//      watermark) preempts running requests of worse aged priority, worst
//      first, until it would fit; it is admitted next step. Only requests of
//      its own tenant or of tenants at or above their share are such
//      victims.
//   3. Prefill chunks cut by step 1's sharing take what the budget still
//      has (never preempting for it).
//   4. Build the output; advance num_computed_tokens of what was scheduled.
// A request whose computed tokens reach num_tokens() in a step produces a
// token; UpdateFromOutput appends it, registers the request's newly computed
// full blocks in the prefix cache, and finishes requests at max_tokens.
//
// KvReservation::kMaxLength instead gives each admitted request a whole
// max-length slab (ceil(max_model_len / block_size) blocks) at admission, so
// it never allocates again and is never preempted for KV.
//
// Block moves of one step: the engine performs blocks_to_swap_out, then
// blocks_to_swap_in, then blocks_to_copy (each in list order), then the
// forward. Blocks freed by a swap-out may be handed to another request in
// the same step (that is why it was preempted): that is safe because every
// write of a step (swap-in, copy, forward) comes after every swap-out. No
// step both swaps out and swaps in (admission stops in a step that
// preempts), so a swap slot is never freed and reused within a step.
//
// Invariants (CheckInvariants verifies them): every live request is either
// running (holding ceil(num_computed_tokens / block_size) blocks; kMaxLength:
// a slab) or waiting: recompute-preempted or never admitted (holding
// nothing, num_computed_tokens == 0) or swapped out (preempted, holding
// ceil(num_computed_tokens / block_size) swap slots and no block); the KV
// manager's invariants (ref counts = table holders, swap slot ownership)
// hold. Running seats (Request::seats(): a request and the completions it
// will still fork) never exceed max_num_seqs through admission, and forks
// of a request admitted with its completions (set_num_completions) take
// seats it holds; only forks of a request that reserved none may exceed it
// (see Fork).
//
// Thread safety: none. Engine thread only; Schedule and UpdateFromOutput
// alternate (UpdateFromOutput of a step before the next Schedule).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/thread_owner.h"
#include "kvcache/kv_cache_manager.h"
#include "scheduler/fair_share.h"
#include "scheduler/kv_reservation.h"
#include "scheduler/request.h"
#include "scheduler/scheduler_config.h"
#include "scheduler/victim_policy.h"

namespace kvserve::scheduler {

// What one request computes in one step. Its new tokens are positions
// [start_position, start_position + num_new_tokens) of its sequence and
// occupy KV indices p - kv_offset; the token at KV index k is written to
// slot block_table[k / B] * B + k % B (B = block size). Its
// token ids and block table live in the SchedulerOutput's flat arrays (read
// them with SchedulerOutput::TokenIds / BlockTable).
struct ScheduledRequest {
  RequestId id = 0;
  // num_computed_tokens before this step (= the first new token's position).
  int32_t start_position = 0;
  int32_t num_new_tokens = 0;
  // Tokens a bounded KV policy dropped before its first kept token past the
  // sinks (Request::kv_dropped_tokens; 0 without a policy): its KV holds
  // start_position + num_new_tokens - kv_offset tokens after this step.
  int32_t kv_offset = 0;
  // With kv_offset > 0 under streaming: KV indices [0, kv_sink_len) are the
  // sinks' blocks, whose tokens sit at their own positions
  // (ForwardBatch::sink_lens).
  int32_t kv_sink_len = 0;
  // Heavy hitters: the step should report its attention mass per block
  // (ForwardBatch::mass_seqs), for AddBlockMass.
  bool track_mass = false;
  // True when this step computes the request's last known token: sample
  // from the logits of its last new token and report the result.
  bool produces_token = false;
  // Speculative decoding: its last num_draft_tokens new tokens are a draft
  // (Scheduler::SetDraft) after its last known token. The step samples the
  // last known token's row and each draft row in turn while the sample
  // equals the next draft token, and reports every token it sampled (1 to
  // num_draft_tokens + 1); KV past the accepted ones is rolled back.
  int32_t num_draft_tokens = 0;
  // Offset of its new tokens in SchedulerOutput::token_ids (the sum of the
  // num_new_tokens before it: ForwardBatch's seq_starts).
  int32_t token_offset = 0;
  // Its whole block table after this step's allocation:
  // SchedulerOutput::block_ids[block_offset, block_offset + num_blocks).
  int32_t block_offset = 0;
  int32_t num_blocks = 0;
};

// Counter increments of one Schedule() call: what the matching cumulative
// counters of SchedulerStats gained in it (each field equals the difference
// of that counter across the call).
struct StepStats {
  int64_t preemptions_recompute = 0;  // num_preemptions_recompute_total
  int64_t preemptions_swap = 0;       // num_preemptions_swap_total
  // Of those, the preemptions for a waiting request of higher priority
  // (num_priority_preemptions_*_total); the rest found no free block.
  int64_t priority_preemptions_recompute = 0;
  int64_t priority_preemptions_swap = 0;
  int64_t recomputed_tokens = 0;  // num_recomputed_tokens_total
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t prefix_cache_uncacheable_tokens = 0;
  int64_t prefix_cache_tail_hits = 0;  // num_tail_hits_total
  int64_t dropped_blocks = 0;          // num_dropped_blocks_total
};

// The plan of one step. Plain data; the engine may keep it until
// UpdateFromOutput.
// NOTE: token ids and block tables are concatenated into two flat arrays
// rather than held per request: one allocation per step instead of two per
// request (the dominant cost at 256 sequences), and token_ids is already the
// ForwardBatch token order.
struct SchedulerOutput {
  int64_t step = 0;
  // Running requests first (admission order), then newly admitted ones.
  std::vector<ScheduledRequest> scheduled;
  // Every scheduled request's new tokens (prompt + output tokens
  // [start_position, start_position + num_new_tokens)), request after
  // request. Its size is total_num_tokens.
  std::vector<int32_t> token_ids;
  // Every scheduled request's block table, request after request.
  std::vector<kvcache::BlockId> block_ids;
  // Requests preempted in this step (their KV blocks are gone; none is
  // scheduled).
  std::vector<RequestId> preempted;
  // Block moves to perform before this step's forward, in this order:
  // KV block src -> swap slot dst (preemption by swap; src's contents are
  // still those of the end of the previous step);
  std::vector<kvcache::BlockMove> blocks_to_swap_out;
  // swap slot src -> KV block dst (readmission of a swapped request);
  std::vector<kvcache::BlockMove> blocks_to_swap_in;
  // KV block src -> KV block dst (copy-on-write of a shared block).
  std::vector<kvcache::BlockMove> blocks_to_copy;
  int32_t total_num_tokens = 0;
  // Counter increments of this step, also when nothing was scheduled.
  StepStats stats;

  [[nodiscard]] bool empty() const { return scheduled.empty(); }
  // Scheduled requests with produces_token: the size `sampled` must have.
  [[nodiscard]] int32_t num_producing() const;
  // `s` must be one of `scheduled`.
  [[nodiscard]] absl::Span<const int32_t> TokenIds(
      const ScheduledRequest& s) const {
    return absl::MakeConstSpan(token_ids).subspan(s.token_offset,
                                                  s.num_new_tokens);
  }
  [[nodiscard]] absl::Span<const kvcache::BlockId> BlockTable(
      const ScheduledRequest& s) const {
    return absl::MakeConstSpan(block_ids).subspan(s.block_offset, s.num_blocks);
  }
};

struct FinishedRequest {
  RequestId id = 0;
  FinishReason reason = FinishReason::kLength;
  // Request::num_preemptions() and kv_stats() at its end.
  int32_t num_preemptions = 0;
  RequestKvStats kv_stats;
};

// Why a running request lost its KV blocks.
enum class PreemptReason {
  kNoFreeBlock,  // a running request's next tokens found no free block
  kPriority,     // a waiting request of higher priority did not fit
};

// Why admission stopped in a step: the typed result of the admission check
// (kNone: the head may be admitted).
enum class AdmissionStop {
  kNone,
  kQueueEmpty,     // nothing waits
  kMaxNumSeqs,     // max_num_seqs requests already run
  kTokenBudget,    // the step's token budget is spent
  kKvBlocks,       // the head's next chunk does not fit above the watermark
  kPreempted,      // the step preempted, so it admitted nothing
  kHighWatermark,  // active blocks exceed admission_high_watermark
  kThrashGuard,    // the thrashing head's remaining prefill does not fit
  kTenantCap,      // every tenant with waiting work runs its max_running
};
[[nodiscard]] absl::string_view AdmissionStopName(AdmissionStop stop);

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;  // includes preempted requests
  // Sequences the waiting requests will run (a request of n counts n).
  int32_t num_waiting_seqs = 0;
  kvcache::KvUsage kv;
  int64_t num_steps = 0;
  int64_t num_preemptions_total = 0;  // recompute + swap
  int64_t num_preemptions_recompute_total = 0;
  int64_t num_preemptions_swap_total = 0;
  // Preemptions that made room for a waiting request of higher priority.
  int64_t num_priority_preemptions_recompute_total = 0;
  int64_t num_priority_preemptions_swap_total = 0;
  // Computed tokens discarded by preemptions (the work they cost; only
  // recompute discards any).
  int64_t num_preempted_tokens_total = 0;
  // The same count, named for the recompute mode.
  int64_t num_recomputed_tokens_total = 0;
  int64_t num_swapped_out_blocks_total = 0;
  int64_t num_swapped_in_blocks_total = 0;
  int32_t swap_slots_used = 0;
  int32_t swap_slots_total = 0;
  // Blocks copied by copy-on-write.
  int64_t num_copied_blocks_total = 0;
  // Prefix hits that took a cached tail (the first tokens of a block past
  // the full ones), each one block copy.
  int64_t num_tail_hits_total = 0;
  // Blocks bounded KV policies (KvWindow) dropped from running requests.
  int64_t num_dropped_blocks_total = 0;
  int64_t num_scheduled_tokens_total = 0;
  int64_t num_finished_total = 0;  // every reason, aborts included
  int64_t num_aborted_total = 0;
  // Prefix cache, in tokens, counted at each admission: tokens looked up
  // (prompt + output of the admitted request) and tokens found cached.
  int64_t prefix_cache_queries_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  // Prompt tokens in a partial last block (num_prompt_tokens % block_size),
  // which no block hash covers (a later request can still hit them as a
  // cached tail once this one ends), counted at each request's first
  // admission with prefix caching on.
  int64_t prefix_cache_uncacheable_tokens = 0;
  // Why the latest step stopped admitting (kQueueEmpty before any step).
  AdmissionStop last_admission_stop = AdmissionStop::kQueueEmpty;
};

class Scheduler {
 public:
  // InvalidArgument when `config` fails Validate().
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Scheduler>> Create(
      const SchedulerConfig& config);
  // Precondition: config.Validate().ok() (KV_CHECKed). Prefer Create.
  explicit Scheduler(const SchedulerConfig& config);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues `request` (status waiting). Errors, in this order:
  //   InvalidArgument   null request, empty prompt, max_tokens < 1;
  //   AlreadyExists     a live request has this id;
  //   OutOfRange        prompt + max_tokens exceeds max_model_len, or needs
  //                     more blocks than the pool minus the watermark (it
  //                     could never run to completion);
  //   ResourceExhausted the waiting queue holds max_queued_requests.
  [[nodiscard]] absl::Status AddRequest(std::unique_ptr<Request> request);

  // Removes a waiting or running request and frees its blocks before
  // returning; its record at the end (as UpdateFromOutput's). NotFound when
  // no live request has `id` (e.g. it finished). Reasons other than kStop
  // and kLength retire it as aborted; `Abort(id)` is `Finish(id,
  // FinishReason::kCancelled)`. A request finished between Schedule and
  // UpdateFromOutput is skipped by the latter.
  absl::StatusOr<FinishedRequest> Finish(RequestId id, FinishReason reason);
  absl::Status Abort(RequestId id) {
    return Finish(id, FinishReason::kCancelled).status();
  }

  // Starts `child` (n > 1 completions) as a copy of running `parent` that
  // shares all of the parent's blocks by ref count, the partially filled
  // last block included (copy-on-write before the child's or the parent's
  // next write into it). The child runs at once with num_computed_tokens =
  // the parent's, the parent's cache_salt and cached-token count, and is
  // scheduled from the next step on; its tokens [0, computed) must equal the
  // parent's and it must have at least one more (typically the prompt plus
  // its own first sampled token).
  // The child takes one of the seats the parent reserved for its
  // completions (Request::set_num_completions); a parent that reserved
  // none lends one anyway: the child joins running_ even when max_num_seqs
  // seats are taken, and admission stays blocked until they are free again.
  // Errors: FailedPrecondition (parent not live or not running, or called
  // between Schedule and UpdateFromOutput), InvalidArgument (null child,
  // tokens differ, nothing left to compute, output already at max_tokens),
  // AddRequest's errors for the child, ResourceExhausted (kMaxLength: no
  // free slab).
  [[nodiscard]] absl::Status Fork(RequestId parent,
                                  std::unique_ptr<Request> child);
  // The parent has forked every child it will: the seats it still holds
  // for completions that never forked are released. No-op for a request
  // that is not live.
  void EndForks(RequestId parent);

  // Plans one step (see the header comment). Precondition: the previous
  // non-empty output went through UpdateFromOutput (KV_CHECKed).
  [[nodiscard]] SchedulerOutput Schedule();

  // Speculative decoding: `draft`, tokens proposed to follow running
  // request `id`'s last token, for the next Schedule. If that step decodes
  // it, it writes its last token and up to draft.size() draft tokens (as
  // many as the step's token budget and its max_tokens leave) and verifies
  // them in the same forward. Ignored for a request not found, and for one
  // with a bounded KV policy (whose drops must never see unverified tokens).
  void SetDraft(RequestId id, std::vector<int32_t> draft);

  // Appends to the k-th scheduled request of `output` that produces tokens
  // its counts[k] sampled tokens (one each when `counts` is empty), taken
  // from `sampled` in order; a request with a draft first rolls its KV back
  // to its accepted tokens (counts[k] - 1 of them) and frees the blocks
  // past them. Finishes (and frees) requests that reach max_tokens and
  // returns them. Stop conditions are the engine's: it calls Finish after.
  // Preconditions: `output` is the latest Schedule()'s; counts is empty or
  // has output.num_producing() entries, each in [1, num_draft_tokens + 1];
  // sampled.size() is their sum (KV_CHECKed).
  std::vector<FinishedRequest> UpdateFromOutput(
      const SchedulerOutput& output, absl::Span<const int32_t> sampled,
      absl::Span<const int32_t> counts = {});
  // Adds the latest step's attention mass per block (ForwardOutput::
  // block_mass: `stride` entries per scheduled request, in `output` order)
  // to its heavy-hitters requests' sums. Before UpdateFromOutput.
  void AddBlockMass(const SchedulerOutput& output, absl::Span<const float> mass,
                    int32_t stride);

  // The live request with `id`, or nullptr.
  [[nodiscard]] const Request* GetRequest(RequestId id) const;
  // Running ids in admission order; waiting ids in queue order.
  [[nodiscard]] std::vector<RequestId> RunningIds() const;
  [[nodiscard]] std::vector<RequestId> WaitingIds() const;

  [[nodiscard]] int32_t num_running() const {
    return static_cast<int32_t>(running_.size());
  }
  // Sequences running or reserved by running requests for their forks.
  [[nodiscard]] int32_t num_running_seats() const {
    return fair_.running_seats();
  }
  [[nodiscard]] int32_t num_waiting() const {
    return static_cast<int32_t>(waiting_.size());
  }
  [[nodiscard]] bool has_work() const {
    return !running_.empty() || !waiting_.empty();
  }
  [[nodiscard]] kvcache::KvUsage kv_usage() const { return kv_.Usage(); }
  [[nodiscard]] SchedulerStats stats() const;
  [[nodiscard]] const SchedulerConfig& config() const { return config_; }
  [[nodiscard]] const kvcache::KvCacheManager& kv_cache() const { return kv_; }
  // The KV tiers' access (engine/kv_tiers.h): loads into the pool outside
  // any request and the record of newly cached blocks; nothing else.
  [[nodiscard]] kvcache::KvCacheManager& kv_cache_for_tiers() { return kv_; }
  // Reports every eviction of a cached block from now on.
  void SetEvictionObserver(kvcache::EvictionObserver observer) {
    kv_.set_eviction_observer(std::move(observer));
  }

  // Makes the calling thread the owner of this scheduler and its KV manager
  // (their mutating methods check it in debug builds). The engine calls it
  // first thing on its thread; without it, the first mutating call binds.
  void BindOwnerThread() {
    owner_.Rebind();
    kv_.BindOwnerThread();
  }

  // Verifies the invariants in the header comment; O(requests + blocks).
  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  // Working state of one Schedule() call.
  struct StepPlan {
    int32_t budget = 0;
    // Tokens kept from running prefills and normal admission for the short
    // lane.
    int32_t reserve = 0;
    // Prefill tokens each running request wanted this step (prompt chunk),
    // by request, for the top-up (TopUpPrefills).
    std::vector<std::pair<Request*, int32_t>> prefill_want;
    std::vector<std::pair<Request*, int32_t>> scheduled;  // (request, tokens)
    std::vector<RequestId> preempted;
    std::vector<kvcache::BlockMove> swap_out, swap_in, copies;
    std::vector<const Request*> copy_owners;  // parallel to copies
  };

  // Step 1: decodes, then prefill chunks sharing what is left but
  // plan.reserve.
  void ScheduleDecodes(StepPlan& plan);
  // Draft tokens `r` may verify this step within `budget` tokens (its
  // draft, cut by max_tokens and by the blocks free of any content).
  [[nodiscard]] int32_t DraftTokens(const Request& r, int64_t budget) const;
  void SchedulePrefills(StepPlan& plan);
  // The short lane (see the header comment): the first of the first
  // kShortLaneWindow waiting requests whose remaining prompt is within the
  // long-prefill threshold and whose tenant may run it now; null if none.
  // `budget`: what the step has left after decodes.
  [[nodiscard]] Request* ShortLaneCandidate(int32_t budget) const;
  // Admits `r` (ShortLaneCandidate's) when normal admission stopped for the
  // token budget alone and `r` fits (seats, KV, not thrashing).
  void AdmitShortLane(Request* r, StepPlan& plan);
  // Step 3: what the budget still has goes to prefill chunks step 1 cut.
  void TopUpPrefills(StepPlan& plan);
  // The waiting request admission considers next (FairShare::Candidate),
  // or null.
  [[nodiscard]] Request* AdmissionCandidate() const {
    return fair_.Candidate();
  }
  // A request's aged priority (lower first); see priority_aging_seconds.
  [[nodiscard]] double Rank(const Request& r) const;
  // Allocates blocks for running_[*index]'s next `n` tokens, preempting
  // victims until it fits. False when the request itself was the victim.
  // Keeps *index pointing at the same request when a victim before it leaves.
  bool AllocateOrPreempt(size_t* index, int32_t n, StepPlan& plan);
  // Whether running `r` may be preempted for waiting `head`: its aged
  // priority is worse than head's, and it is of head's tenant or of a
  // tenant at or above its share.
  [[nodiscard]] bool MayPreemptFor(const Request& r, const Request& head) const;
  void Preempt(size_t index, StepPlan& plan,
               PreemptReason reason = PreemptReason::kNoFreeBlock);
  // Priority policy: when the waiting head did not fit (KV or the high
  // watermark), preempts running requests of larger priority value, worst
  // first, until it fits or none is left. Runs after admission.
  void PreemptForPriority(StepPlan& plan);
  // Whether preempting every running request less important than `head`
  // would let its first chunk in (KV blocks and the high watermark); no
  // request loses its work for a head that would wait anyway.
  [[nodiscard]] bool PriorityPreemptionHelps(const Request& head) const;
  // Raises r's peak_blocks to its table's size.
  void NotePeakBlocks(Request& r);
  // Whether to preempt `r` (holding `blocks` computed blocks) by swap.
  [[nodiscard]] bool ChooseSwap(const Request& r, int32_t blocks) const;
  void AdmitWaiting(StepPlan& plan);
  // Moves waiting `r` to running with its first `n` tokens planned.
  void Admit(Request* r, const kvcache::PrefixMatch& match, int32_t n,
             StepPlan& plan);
  // Whether the next waiting request can be admitted now (kNone) or why
  // not. Sets *next to it (the head, or kCacheAware's pick) and fills *match
  // with its cached prefix (empty with caching off or when it is swapped).
  [[nodiscard]] AdmissionStop NextAdmission(const StepPlan& plan,
                                            Request** next,
                                            kvcache::PrefixMatch* match) const;
  // kCacheAware: the waiting request of `head`'s tenant to admit next and
  // its match.
  [[nodiscard]] Request* PickCacheAware(Request* head,
                                        kvcache::PrefixMatch* match) const;
  [[nodiscard]] kvcache::PrefixMatch MatchPrefix(const Request& r) const;
  // Thrash guard: whether thrashing `r`'s whole remaining prefill from
  // `start` fits now (`n`: what this step would compute).
  [[nodiscard]] bool RemainingPrefillFits(const Request& r,
                                          const kvcache::PrefixMatch& match,
                                          int32_t start, int32_t n,
                                          const StepPlan& plan) const;
  // Whether the blocks of `match` and those for tokens [start, start + n)
  // (AdmissionTokens) can be allocated above the watermark.
  [[nodiscard]] bool CanAdmit(const kvcache::PrefixMatch& match, int32_t start,
                              int32_t n) const;
  // Tokens the admitted head's table must cover after admission
  // (ReservationStrategy::AdmissionTokens).
  [[nodiscard]] int64_t AdmissionTokens(int32_t start, int32_t n) const {
    return reservation_->AdmissionTokens(start, n);
  }
  // Tokens `request` computes this step when it has `computed` already.
  [[nodiscard]] int32_t NumNewTokens(const Request& request, int32_t computed,
                                     int32_t budget) const;
  [[nodiscard]] int32_t NumNewTokens(const Request& request,
                                     int32_t budget) const {
    return NumNewTokens(request, request.num_computed_tokens(), budget);
  }
  // A running request under a KvWindow: drops its blocks that fell out of
  // the window (whole blocks past the sinks' blocks whose tokens all
  // precede its last `window` computed ones).
  void DropOutOfWindow(Request& request);
  // Heavy hitters: drops its lowest-mass blocks past its budget.
  void DropHeavyHitters(Request& request);
  // Registers the newly computed full blocks of a running request.
  void CacheComputedBlocks(const Request& request);
  // Indexes the partially computed last block of a request about to free
  // its blocks, all of whose computed tokens are written.
  void CachePartialBlock(const Request& request);
  [[nodiscard]] SchedulerOutput BuildOutput(StepPlan& plan);
  // The cumulative counters that StepStats reports increments of.
  [[nodiscard]] StepStats CumulativeStepStats() const;
  // Appends prompt + output tokens [begin, begin + n) of `r` to `out`.
  static void AppendTokens(const Request& r, int32_t begin, int32_t n,
                           std::vector<int32_t>& out);
  void Enqueue(Request* request, bool at_head);
  // Takes a waiting request off both queues.
  void Dequeue(Request* request);
  // A request joins / leaves running_ (seat accounting).
  void AddRunning(Request* request);
  void LeaveRunning(const Request* request);
  // Frees the blocks of a request already out of running_ and waiting_ and
  // destroys it.
  void Retire(Request* request, FinishReason reason);
  [[nodiscard]] absl::Status CheckRequest(const Request& request) const;

  SchedulerConfig config_;
  // Paging or max-length slabs (config_.kv_reservation).
  std::unique_ptr<const ReservationStrategy> reservation_;
  // Which running request a preemption takes (config_.policy).
  std::unique_ptr<const VictimPolicy> victims_;
  int32_t watermark_blocks_;
  kvcache::KvCacheManager kv_;
  absl::flat_hash_map<RequestId, std::unique_ptr<Request>> requests_;
  std::map<Request::QueueKey, Request*> waiting_;
  std::vector<Request*> running_;  // admission order
  FairShare fair_;                 // per tenant: queues and running seats

  int64_t next_arrival_seq_ = 0;
  int64_t next_admit_seq_ = 0;
  int64_t next_head_order_ = -1;  // FCFS keys of preempted: before arrivals
  bool pending_update_ = false;
  bool last_step_short_lane_ = false;  // the latest step was the lane's
  size_t block_ids_hint_ = 0;  // capacity to reserve for the next block_ids
  AdmissionStop last_admission_stop_ = AdmissionStop::kQueueEmpty;

  int64_t num_steps_ = 0;
  int64_t num_preemptions_total_ = 0;
  int64_t num_preemptions_swap_total_ = 0;
  int64_t num_priority_preemptions_recompute_total_ = 0;
  int64_t num_priority_preemptions_swap_total_ = 0;
  int64_t num_preempted_tokens_total_ = 0;
  int64_t num_swapped_out_blocks_total_ = 0;
  int64_t num_swapped_in_blocks_total_ = 0;
  int64_t num_copied_blocks_total_ = 0;
  int64_t num_tail_copies_total_ = 0;
  int64_t num_dropped_blocks_total_ = 0;
  int64_t prefix_cache_uncacheable_tokens_ = 0;
  int64_t num_scheduled_tokens_total_ = 0;
  int64_t num_finished_total_ = 0;
  int64_t num_aborted_total_ = 0;
  int64_t prefix_cache_queries_tokens_ = 0;
  int64_t prefix_cache_hit_tokens_ = 0;
  ThreadOwner owner_;  // the one thread that may mutate
};

}  // namespace kvserve::scheduler
