// KvState: a bounded snapshot of the KV cache for people to look at (GET
// /v1/kv/state and the /ui page): the pool by block state, aggregated into
// at most kMaxKvStateCells cells so a million-block pool costs the same as
// a small one; token slots; swap; the live requests (at most
// kMaxKvStateRequests of each kind) with their blocks; cumulative counters
// from which a reader derives events between two snapshots.
//
// Built on the engine thread (BuildKvState reads the scheduler); served to
// any thread as an immutable shared snapshot.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "kvcache/kv_format.h"
#include "scheduler/scheduler.h"

namespace kvserve::engine {

inline constexpr int32_t kMaxKvStateCells = 4096;
inline constexpr int32_t kMaxKvStateRequests = 256;

struct KvStateRequest {
  int64_t id = 0;
  std::string tenant;  // its tenant's name (the scheduler's TenantPolicy)
  // "running", or for waiting requests "waiting" (never admitted),
  // "preempted" (recompute) or "swapped" (holding swap slots).
  std::string state;
  int32_t priority = 0;
  int32_t prompt_tokens = 0, output_tokens = 0, computed_tokens = 0;
  int32_t cached_tokens = 0;
  // Tokens its KV policy dropped from the cache now (kv_policy streaming).
  int32_t dropped_tokens = 0;
  int32_t blocks = 0, swap_slots = 0, preemptions = 0;
};

// One KV tier below the pool (engine/kv_tiers.h).
struct KvStateTier {
  std::string name;  // "disk"
  std::string path;  // its directory
  bool healthy = true;
  int64_t blocks = 0, bytes = 0, capacity_bytes = 0;
  int64_t loading_requests = 0;
  // Cumulative since start.
  int64_t hits = 0, misses = 0, stores = 0, stores_dropped = 0, evictions = 0,
          errors = 0, loads = 0;
};

struct KvState {
  absl::Time time;
  kvcache::KvDtype kv_dtype = kvcache::KvDtype::kBF16;
  int32_t block_size = 0, num_blocks = 0;
  int64_t bytes_per_block = 0;
  int32_t blocks_active = 0, blocks_cached = 0, blocks_free = 0;
  // Token slots (KvCacheManager::WrittenSlots); they sum to num_blocks *
  // block_size.
  int64_t slots_written = 0, slots_unwritten = 0, slots_cached = 0,
          slots_free = 0;
  // Cell i covers block ids [i * blocks_per_cell, (i + 1) * blocks_per_cell)
  // (the last cell may hold fewer): how many of them are in each state.
  int32_t blocks_per_cell = 1;
  std::vector<int32_t> cell_active, cell_cached, cell_free;
  int32_t swap_slots_total = 0, swap_slots_used = 0;
  int32_t num_running = 0, num_waiting = 0;
  std::vector<KvStateRequest> running, waiting;  // admission / queue order
  // Cumulative since start.
  int64_t steps = 0, finished = 0;
  int64_t prefix_query_tokens = 0, prefix_hit_tokens = 0, prefix_tail_hits = 0;
  int64_t evictions = 0;
  int64_t preemptions_recompute = 0, preemptions_swap = 0;
  int64_t swapped_out_blocks = 0, swapped_in_blocks = 0;
  std::vector<KvStateTier> tiers;  // none when the tiers are off
};

// Reads `scheduler` (engine thread only). `written_slots` is the KV
// manager's WrittenSlots now.
[[nodiscard]] KvState BuildKvState(const scheduler::Scheduler& scheduler,
                                   kvcache::KvDtype kv_dtype,
                                   int64_t bytes_per_block,
                                   int64_t written_slots);

}  // namespace kvserve::engine
