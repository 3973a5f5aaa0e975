#include "scheduler/scheduler_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"

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
  if (absl::Status s = AtLeast("long_prefill_token_threshold",
                               long_prefill_token_threshold, 0);
      !s.ok()) {
    return s;
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

absl::StatusOr<KvReservation> ParseKvReservation(absl::string_view name) {
  if (name == "paged") return KvReservation::kPaged;
  if (name == "max-length") return KvReservation::kMaxLength;
  return absl::InvalidArgumentError(absl::StrCat(
      "KV reservation '", name, "' unknown; use paged or max-length"));
}

absl::StatusOr<SchedulingPolicy> ParseSchedulingPolicy(absl::string_view name) {
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  if (name == "priority") return SchedulingPolicy::kPriority;
  return absl::InvalidArgumentError(absl::StrCat(
      "scheduling policy '", name, "' unknown; use fcfs or priority"));
}

}  // namespace kvserve::scheduler
