// Per-request output channel between the engine thread (producer) and the
// RPC layer (consumer). Deltas coalesce while a write is in flight, so a
// slow client costs memory proportional to its backlog of text, never a
// blocked engine. At most one delta is outstanding: the sink is invoked with
// a delta, and again only after the consumer calls Ack().
//
// Thread-safe. The sink runs on the engine thread (from Push/Finish) or on
// the consumer's thread (from Attach/Ack); it must not block.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/request_spec.h"

namespace kvserve::engine {

class StreamState {
 public:
  using Sink = std::function<void(StreamDelta)>;

  // `n` completions share the stream (deltas carry their index).
  explicit StreamState(RequestId id, int32_t n = 1)
      : id_(id), slots_(n < 1 ? 1 : n) {}
  RequestId id() const { return id_; }
  int32_t n() const { return static_cast<int32_t>(slots_.size()); }

  // Producer (engine thread). The overloads without an index are index 0.
  void Push(int32_t index, const std::vector<int32_t>& tokens,
            const std::string& text, std::vector<TokenLogprobs> logprobs);
  void Push(const std::vector<int32_t>& tokens, const std::string& text,
            std::vector<TokenLogprobs> logprobs) {
    Push(0, tokens, text, std::move(logprobs));
  }
  void Finish(int32_t index, FinishReason reason, const Usage& usage,
              const Timings& timings, std::string error = "");
  void Finish(FinishReason reason, const Usage& usage, const Timings& timings,
              std::string error = "") {
    Finish(0, reason, usage, timings, std::move(error));
  }

  // Consumer. Attach once; the sink then receives every delta in order.
  void Attach(Sink sink);
  // The last delta handed to the sink has been written; may call the sink
  // again (on this thread) with what accumulated meanwhile.
  void Ack();
  // True once the final delta (finished = true) has been handed out.
  bool Done() const;

 private:
  // Hands out the pending delta if allowed; call with mu_ held, returns the
  // delta to deliver (outside the lock) or nullopt.
  bool TakeLocked(StreamDelta* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Deliver();

  // One completion's coalesced, not yet delivered output.
  struct Slot {
    StreamDelta pending;
    bool has_pending = false;
    bool finished = false;  // Finish was called for it
  };

  const RequestId id_;
  mutable absl::Mutex mu_;
  Sink sink_ ABSL_GUARDED_BY(mu_);
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  int32_t num_finished_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t next_ ABSL_GUARDED_BY(mu_) = 0;  // round-robin start
  Usage total_usage_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace kvserve::engine
