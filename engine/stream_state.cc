#include "engine/stream_state.h"

#include <algorithm>
#include <utility>

namespace kvserve::engine {

// Hands out one pending delta, visiting completions round-robin so that a
// chatty one cannot starve the others.
bool StreamState::TakeLocked(StreamDelta* out) {
  if (!sink_ || in_flight_ || done_) return false;
  const int32_t n = static_cast<int32_t>(slots_.size());
  for (int32_t k = 0; k < n; ++k) {
    const int32_t i = (next_ + k) % n;
    Slot& slot = slots_[i];
    if (!slot.has_pending) continue;
    *out = std::move(slot.pending);
    slot.pending = StreamDelta{};
    slot.has_pending = false;
    out->index = i;
    next_ = (i + 1) % n;
    in_flight_ = true;
    if (out->index_finished && num_finished_ == n) {
      bool others = false;
      for (const Slot& s : slots_) others = others || s.has_pending;
      if (!others) {
        out->finished = true;
        out->usage = total_usage_;
        done_ = true;
      }
    }
    return true;
  }
  return false;
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

void StreamState::Push(int32_t index, const std::vector<int32_t>& tokens,
                       const std::string& text,
                       std::vector<TokenLogprobs> logprobs) {
  {
    absl::MutexLock lock(&mu_);
    if (index < 0 || index >= static_cast<int32_t>(slots_.size())) return;
    Slot& slot = slots_[index];
    if (slot.finished) return;
    StreamDelta& p = slot.pending;
    p.token_ids.insert(p.token_ids.end(), tokens.begin(), tokens.end());
    p.text += text;
    for (auto& lp : logprobs) p.logprobs.push_back(std::move(lp));
    slot.has_pending = true;
  }
  Deliver();
}

void StreamState::Finish(int32_t index, FinishReason reason, const Usage& usage,
                         const Timings& timings, std::string error) {
  {
    absl::MutexLock lock(&mu_);
    if (index < 0 || index >= static_cast<int32_t>(slots_.size())) return;
    Slot& slot = slots_[index];
    if (slot.finished || done_) return;
    slot.finished = true;
    ++num_finished_;
    StreamDelta& p = slot.pending;
    p.index_finished = true;
    p.finish_reason = reason;
    p.usage = usage;
    p.timings = timings;
    p.error = std::move(error);
    slot.has_pending = true;
    // The prompt is shared: counted once.
    total_usage_.prompt_tokens =
        std::max(total_usage_.prompt_tokens, usage.prompt_tokens);
    const bool most_cached =
        usage.cached_prompt_tokens >= total_usage_.cached_prompt_tokens;
    total_usage_.cached_prompt_tokens =
        std::max(total_usage_.cached_prompt_tokens, usage.cached_prompt_tokens);
    total_usage_.completion_tokens += usage.completion_tokens;
    const KvUsage before = total_usage_.kv;
    AddKvUsage(usage.kv, &total_usage_.kv);
    const KvUsage& split = most_cached ? usage.kv : before;
    total_usage_.kv.cached_tokens_device = split.cached_tokens_device;
    total_usage_.kv.cached_tokens_host = split.cached_tokens_host;
    total_usage_.kv.cached_tokens_disk = split.cached_tokens_disk;
    total_usage_.kv.cached_tokens_remote = split.cached_tokens_remote;
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
