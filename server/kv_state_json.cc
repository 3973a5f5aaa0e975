#include "server/kv_state_json.h"

#include <vector>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

json RequestsJson(const std::vector<engine::KvStateRequest>& requests) {
  json out = json::array();
  for (const engine::KvStateRequest& r : requests) {
    out.push_back({{"id", r.id},
                   {"state", r.state},
                   {"priority", r.priority},
                   {"prompt_tokens", r.prompt_tokens},
                   {"output_tokens", r.output_tokens},
                   {"computed_tokens", r.computed_tokens},
                   {"cached_tokens", r.cached_tokens},
                   {"blocks", r.blocks},
                   {"swap_slots", r.swap_slots},
                   {"preemptions", r.preemptions}});
  }
  return out;
}

}  // namespace

std::string KvStateJson(const engine::KvState& s,
                        const std::string& model_name) {
  json j = {
      {"object", "kvserve.kv_state"},
      {"time", absl::ToDoubleSeconds(s.time - absl::UnixEpoch())},
      {"model", model_name},
      {"kv_dtype", s.kv_dtype},
      {"block_size", s.block_size},
      {"bytes_per_block", s.bytes_per_block},
      {"num_blocks", s.num_blocks},
      {"blocks",
       {{"active", s.blocks_active},
        {"cached", s.blocks_cached},
        {"free", s.blocks_free}}},
      {"token_slots",
       {{"active_written", s.slots_written},
        {"active_unwritten", s.slots_unwritten},
        {"cached", s.slots_cached},
        {"free", s.slots_free},
        {"capacity", static_cast<int64_t>(s.num_blocks) * s.block_size}}},
      {"grid",
       {{"blocks_per_cell", s.blocks_per_cell},
        {"cells", s.cell_active.size()},
        {"active", s.cell_active},
        {"cached", s.cell_cached},
        {"free", s.cell_free}}},
      {"swap",
       {{"slots_total", s.swap_slots_total},
        {"slots_used", s.swap_slots_used}}},
      {"requests",
       {{"num_running", s.num_running},
        {"num_waiting", s.num_waiting},
        {"running", RequestsJson(s.running)},
        {"waiting", RequestsJson(s.waiting)}}},
      {"counters",
       {{"steps", s.steps},
        {"finished", s.finished},
        {"prefix_query_tokens", s.prefix_query_tokens},
        {"prefix_hit_tokens", s.prefix_hit_tokens},
        {"prefix_tail_hits", s.prefix_tail_hits},
        {"evictions", s.evictions},
        {"preemptions_recompute", s.preemptions_recompute},
        {"preemptions_swap", s.preemptions_swap},
        {"swapped_out_blocks", s.swapped_out_blocks},
        {"swapped_in_blocks", s.swapped_in_blocks}}},
  };
  return j.dump();
}

}  // namespace kvserve::server
