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
  // (priority, arrival) order, lower priority value first. Victim: the
  // running request with the largest priority value, most recently admitted
  // among equals.
  kPriority,
};

// How much KV a request must find free to be admitted.
enum class AdmissionPolicy {
  // Admit when its next chunk fits above the watermark; preempt later if the
  // pool runs out while requests grow.
  kMaxUtilization,
  // Admit only when prompt + max_tokens of it and the not-yet-allocated rest
  // of every running request fit above the watermark: never preempts.
  kGuaranteedNoEvict,
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
  int32_t max_num_seqs = 256;
  // Per-step token budget over all scheduled requests.
  int32_t max_num_batched_tokens = 2048;
  // Tokens per KV block and blocks in the pool.
  int32_t block_size = 16;
  int32_t num_blocks = 0;
  // Fraction of the pool admission keeps free (running requests may still
  // use it to grow): floor(watermark * num_blocks) blocks.
  double watermark = 0.01;
  // Most tokens one request computes in one step (0 = only the step budget
  // limits it): keeps a long prompt from taking a whole step.
  int32_t long_prefill_token_threshold = 0;
  // Most requests in the waiting queue before AddRequest refuses more
  // (preempted requests always re-enter).
  int32_t max_queued_requests = 4096;
  // prompt + max_tokens limit of one request.
  int32_t max_model_len = 4096;
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  AdmissionPolicy admission = AdmissionPolicy::kMaxUtilization;
  KvReservation kv_reservation = KvReservation::kPaged;
  // Reuse the KV blocks of cached prompt prefixes (full blocks only; the
  // last prompt token is always recomputed).
  bool enable_prefix_caching = true;
  // Part of the prefix-cache namespace with each request's cache_salt.
  std::string model_id;

  // InvalidArgument naming the first field out of range.
  [[nodiscard]] absl::Status Validate() const;
  // floor(watermark * num_blocks).
  [[nodiscard]] int32_t watermark_blocks() const;
  // ceil(max_model_len / block_size): the blocks of one kMaxLength slab.
  [[nodiscard]] int64_t slab_blocks() const;
};

// "fcfs" | "priority"; InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(
    absl::string_view name);

// "paged" | "max-length"; InvalidArgument otherwise.
[[nodiscard]] absl::StatusOr<KvReservation> ParseKvReservation(
    absl::string_view name);

}  // namespace kvserve::scheduler
