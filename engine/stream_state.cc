#include "engine/stream_state.h"

#include <utility>

namespace kvserve::engine {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
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

bool StreamState::TakeLocked(StreamDelta* out) {
  if (!sink_ || in_flight_ || !has_pending_ || done_) return false;
  *out = std::move(pending_);
  pending_ = StreamDelta{};
  has_pending_ = false;
  in_flight_ = true;
  if (out->finished) done_ = true;
  return true;
}

void StreamState::Deliver() {
  StreamDelta delta;
  Sink sink;
  {
    absl::MutexLock lock(&mu_);
    if (!TakeLocked(&delta)) return;
    sink = sink_;
  }
  sink(std::move(delta));
}

void StreamState::Push(const std::vector<int32_t>& tokens,
                       const std::string& text,
                       std::vector<TokenLogprobs> logprobs) {
  {
    absl::MutexLock lock(&mu_);
    if (pending_.finished) return;
    pending_.token_ids.insert(pending_.token_ids.end(), tokens.begin(),
                              tokens.end());
    pending_.text += text;
    for (auto& lp : logprobs) pending_.logprobs.push_back(std::move(lp));
    has_pending_ = true;
  }
  Deliver();
}

void StreamState::Finish(FinishReason reason, const Usage& usage,
                         const Timings& timings, std::string error) {
  {
    absl::MutexLock lock(&mu_);
    if (pending_.finished || done_) return;
    pending_.finished = true;
    pending_.finish_reason = reason;
    pending_.usage = usage;
    pending_.timings = timings;
    pending_.error = std::move(error);
    has_pending_ = true;
  }
  Deliver();
}

void StreamState::Attach(Sink sink) {
  {
    absl::MutexLock lock(&mu_);
    sink_ = std::move(sink);
  }
  Deliver();
}

void StreamState::Ack() {
  {
    absl::MutexLock lock(&mu_);
    in_flight_ = false;
  }
  Deliver();
}

bool StreamState::Done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

}  // namespace kvserve::engine
