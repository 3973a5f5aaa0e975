#include "scheduler/scheduler_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/field_error.h"
#include "scheduler/kv_reservation.h"

namespace kvserve::scheduler {
namespace {

absl::Status AtLeast(absl::string_view field, int64_t value, int64_t min) {
  if (value >= min) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "scheduler config: ", field, " must be >= ", min, ", got ", value));
}

}  // namespace

absl::Status SchedulerConfig::Validate() const {
  for (const auto& [field, value] : {
           std::pair<absl::string_view, int64_t>{"max_num_seqs", max_num_seqs},
           {"max_num_batched_tokens", max_num_batched_tokens},
           {"block_size", block_size},
           {"num_blocks", num_blocks},
           {"max_queued_requests", max_queued_requests},
           {"max_model_len", max_model_len},
       }) {
    if (absl::Status s = AtLeast(field, value, 1); !s.ok()) return s;
  }
  for (const auto& [field, value] : {
           std::pair<absl::string_view, int64_t>{"long_prefill_token_threshold",
                                                 long_prefill_token_threshold},
           {"num_swap_slots", num_swap_slots},
           {"thrash_preemption_limit", thrash_preemption_limit},
       }) {
    if (absl::Status s = AtLeast(field, value, 0); !s.ok()) return s;
  }
  for (const auto& [field, value] : {
           std::pair<absl::string_view, double>{"recompute_seconds_per_token",
                                                recompute_seconds_per_token},
           {"swap_seconds_per_block", swap_seconds_per_block},
       }) {
    if (!(value >= 0.0 && std::isfinite(value))) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler config: ", field,
                       " must be a finite number >= 0, got ", value));
    }
  }
  if (!(admission_high_watermark > 0.0 && admission_high_watermark <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler config: admission_high_watermark must be in "
                     "(0, 1], got ",
                     admission_high_watermark));
  }
  if (!(priority_aging_seconds >= 0.0 && priority_aging_seconds <= 3600.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler config: priority_aging_seconds must be in [0, 3600], got ",
        priority_aging_seconds));
  }
  if (!(watermark >= 0.0 && watermark < 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler config: watermark must be in [0, 1), got ", watermark));
  }
  return absl::OkStatus();
}

int32_t SchedulerConfig::watermark_blocks() const {
  return static_cast<int32_t>(std::floor(watermark * num_blocks));
}

int64_t SchedulerConfig::slab_blocks() const {
  return (int64_t{max_model_len} + block_size - 1) / block_size;
}

absl::Status SchedulerConfig::CheckKvWindow(int64_t sinks, int64_t window,
                                            int64_t budget) const {
  if (kv_reservation != KvReservation::kPaged) {
    return InvalidFieldError(
        "kv_policy.type",
        "streaming needs --kv-reservation=paged (a max-length slab is held "
        "whole)");
  }
  if (sinks < 0 || sinks > max_model_len) {
    return InvalidFieldError(
        "kv_policy.sinks",
        absl::StrCat("must be in [0, ", max_model_len, "], got ", sinks));
  }
  const int64_t sink_tokens =
      (sinks + block_size - 1) / block_size * block_size;
  const int64_t most = int64_t{max_model_len} - sink_tokens - block_size - 1;
  if (window < 1 || window > most) {
    return InvalidFieldError(
        "kv_policy.window",
        absl::StrCat("must be in [1, ", std::max<int64_t>(most, 0), "], got ",
                     window, " (the sinks' ", sink_tokens,
                     " tokens in whole blocks + window + one block of ",
                     block_size, " must stay under max_model_len ",
                     max_model_len, ")"));
  }
  // Heavy hitters: room for the sinks' blocks, the window and one block,
  // and below max_model_len like the window.
  const int64_t least = sink_tokens + window + block_size;
  if (budget != 0 && (budget < least || budget > most + block_size)) {
    return InvalidFieldError(
        "kv_policy.budget",
        absl::StrCat("must be in [", least, ", ", most + block_size, "], got ",
                     budget, " (at least the sinks' ", sink_tokens,
                     " tokens in whole blocks + window + one block of ",
                     block_size, "; under max_model_len ", max_model_len, ")"));
  }
  return absl::OkStatus();
}

absl::Status SchedulerConfig::CheckRequestSize(int64_t prompt_tokens,
                                               int64_t max_tokens,
                                               bool bounded) const {
  if (prompt_tokens <= 0) {
    return InvalidFieldError("prompt", "must not be empty");
  }
  if (max_tokens < 1) {
    return InvalidFieldError("max_tokens",
                             absl::StrCat("must be >= 1, got ", max_tokens));
  }
  const int64_t total = prompt_tokens + max_tokens;
  if (bounded) {
    // Its table never passes max_model_len tokens (Scheduler::NumNewTokens).
    const int64_t blocks = MakeReservation(*this)->MostBlocks(
        std::min<int64_t>(total, max_model_len));
    if (blocks > int64_t{num_blocks} - watermark_blocks()) {
      return absl::OutOfRangeError(absl::StrCat(
          "a KV window of up to ", max_model_len, " tokens needs ", blocks,
          " KV blocks, but the pool has ", num_blocks - watermark_blocks(),
          " usable (--kv-cache-bytes)"));
    }
    return absl::OkStatus();
  }
  if (prompt_tokens >= max_model_len) {
    return InvalidFieldError(
        "prompt",
        absl::StrCat(prompt_tokens, " tokens, over the model's context of ",
                     max_model_len,
                     " (at least one token must be left to generate)"));
  }
  if (total > max_model_len) {
    return InvalidFieldError(
        "max_tokens",
        absl::StrCat("prompt (", prompt_tokens, " tokens) + max_tokens (",
                     max_tokens, ") exceeds the model's context of ",
                     max_model_len));
  }
  const int64_t blocks = MakeReservation(*this)->MostBlocks(total);
  const int64_t usable = int64_t{num_blocks} - watermark_blocks();
  if (blocks > usable) {
    return absl::OutOfRangeError(absl::StrCat(
        "prompt (", prompt_tokens, " tokens) + max_tokens (", max_tokens,
        ") = ", total, " tokens need ", blocks, " KV blocks of ", block_size,
        " tokens, but the pool has ", num_blocks, " blocks (",
        watermark_blocks(), " kept free by the watermark, ", usable,
        " usable): it can never fit the KV cache (--kv-cache-bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<KvReservation> ParseKvReservation(absl::string_view name) {
  if (name == "paged") return KvReservation::kPaged;
  if (name == "max-length") return KvReservation::kMaxLength;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv-reservation: KV reservation '", name,
                   "' unknown; use paged or max-length"));
}

absl::string_view KvReservationName(KvReservation reservation) {
  switch (reservation) {
    case KvReservation::kPaged:
      return "paged";
    case KvReservation::kMaxLength:
      return "max-length";
  }
  return "unknown";
}

absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view name) {
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  if (name == "priority") return SchedulingPolicy::kPriority;
  if (name == "cache-aware") return SchedulingPolicy::kCacheAware;
  return absl::InvalidArgumentError(
      absl::StrCat("--scheduling-policy: scheduling policy '", name,
                   "' unknown; use fcfs, priority or cache-aware"));
}

absl::string_view SchedulingPolicyName(SchedulingPolicy policy) {
  switch (policy) {
    case SchedulingPolicy::kFcfs:
      return "fcfs";
    case SchedulingPolicy::kPriority:
      return "priority";
    case SchedulingPolicy::kCacheAware:
      return "cache-aware";
  }
  return "unknown";
}

absl::StatusOr<PreemptionMode> ParsePreemptionMode(absl::string_view name) {
  if (name == "auto") return PreemptionMode::kAuto;
  if (name == "recompute") return PreemptionMode::kRecompute;
  if (name == "swap") return PreemptionMode::kSwap;
  return absl::InvalidArgumentError(
      absl::StrCat("--preemption-mode: preemption mode '", name,
                   "' unknown; use auto, recompute or swap"));
}

absl::string_view PreemptionModeName(PreemptionMode mode) {
  switch (mode) {
    case PreemptionMode::kAuto:
      return "auto";
    case PreemptionMode::kRecompute:
      return "recompute";
    case PreemptionMode::kSwap:
      return "swap";
  }
  return "unknown";
}

}  // namespace kvserve::scheduler
