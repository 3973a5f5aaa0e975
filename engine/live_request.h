// LiveRequest: one request as the engine thread sees it (its stream, output
// processing, timings and accounting), and the map of the live ones. Owned
// by Engine::Impl; engine thread only. What sampling needs is the model
// runner's (RunnerRequest).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "engine/output_processor.h"
#include "engine/request_spec.h"
#include "engine/speculation.h"
#include "engine/stream_state.h"
#include "scheduler/request.h"

namespace kvserve::engine {

struct LiveRequest {
  RequestId id;
  RequestSpec spec;
  std::shared_ptr<StreamState> stream;
  std::unique_ptr<OutputProcessor> output;
  absl::Time arrival, first_scheduled = absl::InfinitePast(),
                      first_token = absl::InfinitePast(),
                      last_token = absl::InfinitePast();
  int32_t completion_tokens = 0;
  // Prompt tokens served from the prefix cache (read when first scheduled).
  int32_t cached_prompt_tokens = 0;
  // Prompt tokens a KV tier load put into the pool for it, by tier
  // (engine/kv_tiers.h).
  int32_t disk_prompt_tokens = 0;
  int32_t remote_prompt_tokens = 0;
  int32_t host_prompt_tokens = 0;
  // Completion index in the shared stream (n > 1), and children this
  // request (index 0) still has to fork once its prompt is computed.
  int32_t index = 0;
  int32_t pending_forks = 0;
  // Completions counted in its tenant's queue (Submit) until it is first
  // scheduled or ends.
  int32_t queued_completions = 0;
  int32_t num_preemptions = 0;  // as of its latest scheduling
  // The scheduler's KV accounting as of its latest scheduling.
  scheduler::RequestKvStats kv_stats;
  // Since its latest preemption (InfinitePast: not preempted now), and the
  // time it spent preempted before that.
  absl::Time preempted_at = absl::InfinitePast();
  double preempted_seconds = 0;
  // Speculative decoding: its acceptance history and totals.
  SpeculationControl speculation;
  int64_t draft_tokens = 0, accepted_draft_tokens = 0;
};

using LiveRequestMap =
    absl::flat_hash_map<RequestId, std::unique_ptr<LiveRequest>>;

}  // namespace kvserve::engine
