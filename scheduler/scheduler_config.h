// SchedulerConfig: the knobs of continuous batching and KV admission. Plain
// data plus its validation; owns nothing.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvserve::scheduler {

// Order of the waiting queue and choice of preemption victims.
enum class SchedulingPolicy {
  // Arrival order; preempted requests go back to the head. Victim: the most
  // recently admitted running request.
  kFcfs,
  // Aged priority order: lower priority value first, where each
  // priority_aging_seconds of waiting is worth one level (see there).
  // Victim: the running request with the worst aged priority, most
  // recently admitted among equals.
  kPriority,
  // Aged priority order like kPriority, but among the first
  // kCacheAwareWindow never-admitted waiting requests of the head's priority
  // the one with the longest cached prefix goes first (ties: arrival order)
  // unless the head was passed over kCacheAwareMaxPasses times already.
  // Preempted requests keep the head, in FCFS order. Victim: as kPriority.
  kCacheAware,
};

// How cache-aware admission bounds its per-admission cost: it looks up the
// cached prefix of at most this many waiting requests.
inline constexpr int32_t kCacheAwareWindow = 8;
// How cache-aware admission bounds a fresh prompt's wait: the request at
// the head of its queue is passed over by at most this many admissions of
// better-cached requests behind it, then taken.
inline constexpr int32_t kCacheAwareMaxPasses = 8;
// How far the short lane looks into the waiting queue for a short request
// (scheduler.h).
inline constexpr int32_t kShortLaneWindow = 16;

// How a preempted request gives its KV blocks back.
enum class PreemptionMode {
  // Per victim, the cheaper of recompute and swap by the cost model
  // (recompute: computed tokens x recompute_seconds_per_token; swap:
  // 2 x blocks x swap_seconds_per_block); recompute when slots lack.
  kAuto,
  // Drop its KV; recompute prompt + output on readmission.
  kRecompute,
  // Copy its blocks to host swap slots and back on readmission; recompute
  // when the swap space lacks free slots.
  kSwap,
};

// How much KV a running request holds.
enum class KvReservation {
  // Paging: blocks are allocated as tokens are computed.
  kPaged,
  // Emulates contiguous max-length slabs: at admission a request takes
  // ceil(max_model_len / block_size) blocks and holds them until it finishes
  // (no prefix sharing); admission waits until a whole slab is free.
  kMaxLength,
};

struct SchedulerConfig {
  // Most requests running (holding blocks) at once.
  int32_t max_num_seqs = 64;
  // Per-step token budget over all scheduled requests.
  int32_t max_num_batched_tokens = 512;
  // Tokens per KV block and blocks in the pool.
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  // Fraction of the pool admission keeps free (running requests may still
  // use it to grow): floor(watermark * num_blocks) blocks.
  double watermark = 0.01;
  // Most tokens one request computes in one step (0 = only the step budget
  // limits it): keeps a long prompt from taking a whole step, so a short
  // request's first token need not wait for a long prefill. 256 (half the
  // default budget) cut that wait 14x for +5% on the long prompt's TTFT
  // (docs/PERFORMANCE.md, head-of-line blocking).
  int32_t long_prefill_token_threshold = 256;
  // Most requests in the waiting queue before AddRequest refuses more
  // (preempted requests always re-enter).
  int32_t max_queued_requests = 4096;
  // prompt + max_tokens limit of one request.
  int32_t max_model_len = 4096;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // Aging (kPriority, kCacheAware): seconds of waiting worth one priority
  // level. A waiting request is ordered by priority + arrival time / this,
  // so a request is never passed by one that arrived more than (its
  // priority - the other's) x this later, and no request waits unboundedly
  // behind a flood of more important ones. 0: priorities never age.
  double priority_aging_seconds = 0.1;
  KvReservation kv_reservation = KvReservation::kPaged;
  // Reuse the KV blocks of cached prompt prefixes (full blocks only; the
  // last prompt token is always recomputed).
  bool enable_prefix_caching = true;
  // Part of the prefix-cache namespace with each request's cache_salt.
  std::string model_id;
  // Host swap slots (one KV block each); 0 disables swapping.
  int32_t num_swap_slots = 0;
  PreemptionMode preemption_mode = PreemptionMode::kAuto;
  // Cost model inputs (the engine fills them from the backend): seconds to
  // recompute one token, and to copy one block between KV and swap (one
  // way). Both 0: kAuto recomputes.
  double recompute_seconds_per_token = 0.0;
  double swap_seconds_per_block = 0.0;
  // A request preempted this many times in a row (without catching up to
  // its last token in between) is readmitted only when its whole remaining
  // prefill fits at once (KV blocks and, when possible, the step budget).
  // 0 disables the guard.
  int32_t thrash_preemption_limit = 3;
  // No admission while active blocks (neither free nor cached-evictable)
  // exceed this fraction of the pool. In (0, 1]; 1 disables it.
  double admission_high_watermark = 0.95;

  // InvalidArgument naming the first field out of range.
  [[nodiscard]] absl::Status Validate() const;
  // floor(watermark * num_blocks).
  [[nodiscard]] int32_t watermark_blocks() const;
  // ceil(max_model_len / block_size): the blocks of one kMaxLength slab.
  [[nodiscard]] int64_t slab_blocks() const;
  // Whether a request of `prompt_tokens` and `max_tokens` can ever run: the
  // one check of these limits, used by the scheduler and by the engine
  // before it queues a request. InvalidArgument, a field error naming
  // "prompt" or "max_tokens" (common/field_error.h), for an empty prompt,
  // max_tokens < 1, or past max_model_len; OutOfRange (no field) when its
  // blocks (a whole slab under kMaxLength) exceed the pool less the
  // watermark.
  // `bounded`: the request runs under a KV window (CheckKvWindow), which
  // holds at most max_model_len tokens however long it runs, so its prompt
  // and max_tokens may pass the context.
  [[nodiscard]] absl::Status CheckRequestSize(int64_t prompt_tokens,
                                              int64_t max_tokens,
                                              bool bounded = false) const;
  // Whether a "streaming" KV policy (scheduler::KvWindow) of `sinks` and
  // `window` tokens can be honoured: paged reservation (a slab is held
  // whole), sinks >= 0, window >= 1, and the sinks' whole blocks + window +
  // one block under max_model_len (room for the next token after a drop).
  // InvalidArgument naming kv_policy.sinks or kv_policy.window otherwise.
  [[nodiscard]] absl::Status CheckKvWindow(int64_t sinks, int64_t window,
                                           int64_t budget = 0) const;
};

// "fcfs" | "priority" | "cache-aware"; InvalidArgument otherwise (naming
// --scheduling-policy and the allowed values).
[[nodiscard]] absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(
    absl::string_view name);

// "paged" | "max-length"; InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<KvReservation> ParseKvReservation(
    absl::string_view name);

// "auto" | "recompute" | "swap"; InvalidArgument otherwise (naming
// --preemption-mode and the allowed values).
[[nodiscard]] absl::StatusOr<PreemptionMode> ParsePreemptionMode(
    absl::string_view name);
[[nodiscard]] absl::string_view PreemptionModeName(PreemptionMode mode);
[[nodiscard]] absl::string_view KvReservationName(KvReservation reservation);
[[nodiscard]] absl::string_view SchedulingPolicyName(SchedulingPolicy policy);

}  // namespace kvserve::scheduler
