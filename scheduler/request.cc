#include "scheduler/request.h"

#include <utility>

namespace kvserve::scheduler {

absl::string_view RequestStatusName(RequestStatus status) {
  switch (status) {
    case RequestStatus::kWaiting:
      return "waiting";
    case RequestStatus::kRunning:
      return "running";
    case RequestStatus::kPreempted:
      return "preempted";
    case RequestStatus::kFinishedStopped:
      return "finished_stopped";
    case RequestStatus::kFinishedLength:
      return "finished_length";
    case RequestStatus::kFinishedAborted:
      return "finished_aborted";
  }
  return "unknown";
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kDeadline:
      return "deadline";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

Request::Request(RequestId id, std::vector<int32_t> prompt_token_ids,
                 int32_t max_tokens, int32_t priority, int64_t arrival_time_ns)
    : id_(id),
      prompt_(std::move(prompt_token_ids)),
      max_tokens_(max_tokens),
      priority_(priority),
      arrival_time_ns_(arrival_time_ns) {}

bool Request::is_finished() const {
  return status_ == RequestStatus::kFinishedStopped ||
         status_ == RequestStatus::kFinishedLength ||
         status_ == RequestStatus::kFinishedAborted;
}

}  // namespace kvserve::scheduler
