#include "engine/kv_state.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace kvserve::engine {
namespace {

KvStateRequest Describe(const scheduler::Scheduler& s,
                        const scheduler::Request& r) {
  const kvcache::KvCacheManager& kv = s.kv_cache();
  KvStateRequest out;
  out.id = r.id();
  out.tenant = r.tenant().name;
  out.swap_slots = kv.num_swapped_blocks(r.id());
  switch (r.status()) {
    case scheduler::RequestStatus::kRunning:
      out.state = "running";
      break;
    case scheduler::RequestStatus::kPreempted:
      out.state = out.swap_slots > 0 ? "swapped" : "preempted";
      break;
    default:
      out.state = "waiting";
  }
  out.priority = r.priority();
  out.prompt_tokens = r.num_prompt_tokens();
  out.output_tokens = r.num_output_tokens();
  out.computed_tokens = r.num_computed_tokens();
  out.dropped_tokens = r.kv_dropped_tokens();
  out.cached_tokens = r.num_cached_tokens();
  out.blocks = static_cast<int32_t>(kv.GetBlockTable(r.id()).size());
  out.preemptions = r.num_preemptions();
  return out;
}

void DescribeAll(const scheduler::Scheduler& s,
                 const std::vector<scheduler::RequestId>& ids,
                 std::vector<KvStateRequest>* out) {
  const size_t n = std::min<size_t>(ids.size(), kMaxKvStateRequests);
  out->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (const scheduler::Request* r = s.GetRequest(ids[i])) {
      out->push_back(Describe(s, *r));
    }
  }
}

// The pool's blocks by state, cell by cell.
void FillGrid(const kvcache::BlockPool& pool, KvState* st) {
  const int32_t n = pool.num_blocks();
  st->blocks_per_cell = (n + kMaxKvStateCells - 1) / kMaxKvStateCells;
  const int32_t cells = (n + st->blocks_per_cell - 1) / st->blocks_per_cell;
  st->cell_active.assign(cells, 0);
  st->cell_cached.assign(cells, 0);
  st->cell_free.assign(cells, 0);
  for (kvcache::BlockId b = 0; b < n; ++b) {
    const int32_t c = b / st->blocks_per_cell;
    if (pool.ref_count(b) > 0) {
      ++st->cell_active[c];
    } else if (pool.block_hash(b).has_value()) {
      ++st->cell_cached[c];
    } else {
      ++st->cell_free[c];
    }
  }
}

}  // namespace

KvState BuildKvState(const scheduler::Scheduler& scheduler,
                     kvcache::KvDtype kv_dtype, int64_t bytes_per_block,
                     int64_t written_slots) {
  const scheduler::SchedulerStats s = scheduler.stats();
  const kvcache::KvCacheManager& kv = scheduler.kv_cache();
  KvState st;
  st.time = absl::Now();
  st.kv_dtype = kv_dtype;
  st.block_size = kv.block_size();
  st.num_blocks = kv.num_blocks();
  st.bytes_per_block = bytes_per_block;
  st.blocks_active = s.kv.active_blocks;
  st.blocks_cached = s.kv.cached_evictable_blocks;
  st.blocks_free = s.kv.free_blocks - s.kv.cached_evictable_blocks;
  const int64_t bs = st.block_size;
  st.slots_written = written_slots;
  st.slots_unwritten = st.blocks_active * bs - written_slots;
  st.slots_cached = st.blocks_cached * bs;
  st.slots_free = st.blocks_free * bs;
  FillGrid(kv.pool(), &st);
  st.swap_slots_total = s.kv.swap_slots_total;
  st.swap_slots_used = s.kv.swap_slots_used;
  st.num_running = s.num_running;
  st.num_waiting = s.num_waiting;
  DescribeAll(scheduler, scheduler.RunningIds(), &st.running);
  DescribeAll(scheduler, scheduler.WaitingIds(), &st.waiting);
  st.steps = s.num_steps;
  st.finished = s.num_finished_total;
  st.prefix_query_tokens = s.prefix_cache_queries_tokens;
  st.prefix_hit_tokens = s.prefix_cache_hit_tokens;
  st.prefix_tail_hits = s.num_tail_hits_total;
  for (int i = 0; i < kvcache::kNumEvictReasons; ++i) {
    st.evictions += kv.pool().evictions(static_cast<kvcache::EvictReason>(i));
  }
  st.preemptions_recompute = s.num_preemptions_recompute_total;
  st.preemptions_swap = s.num_preemptions_swap_total;
  st.swapped_out_blocks = s.num_swapped_out_blocks_total;
  st.swapped_in_blocks = s.num_swapped_in_blocks_total;
  return st;
}

}  // namespace kvserve::engine
