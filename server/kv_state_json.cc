#include "server/kv_state_json.h"

#include <vector>

#include "absl/time/time.h"
#include "kvcache/kv_format.h"
#include "nlohmann/json.hpp"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

json RequestsJson(const std::vector<engine::KvStateRequest>& requests,
                  const std::string* tenant) {
  json out = json::array();
  for (const engine::KvStateRequest& r : requests) {
    if (tenant != nullptr && r.tenant != *tenant) continue;
    out.push_back({{"id", r.id},
                   {"tenant", r.tenant},
                   {"state", r.state},
                   {"priority", r.priority},
                   {"prompt_tokens", r.prompt_tokens},
                   {"output_tokens", r.output_tokens},
                   {"computed_tokens", r.computed_tokens},
                   {"dropped_tokens", r.dropped_tokens},
                   {"cached_tokens", r.cached_tokens},
                   {"blocks", r.blocks},
                   {"swap_slots", r.swap_slots},
                   {"preemptions", r.preemptions}});
  }
  return out;
}

}  // namespace

std::string KvStateJson(const engine::KvState& s, const std::string& model_name,
                        const std::string* tenant) {
  json running = RequestsJson(s.running, tenant);
  json waiting = RequestsJson(s.waiting, tenant);
  // A tenant's view counts its own (among the listed ones).
  const int64_t num_running =
      tenant == nullptr ? s.num_running : static_cast<int64_t>(running.size());
  const int64_t num_waiting =
      tenant == nullptr ? s.num_waiting : static_cast<int64_t>(waiting.size());
  json j = {
      {"object", "kvserve.kv_state"},
      {"time", absl::ToDoubleSeconds(s.time - absl::UnixEpoch())},
      {"model", model_name},
      {"kv_dtype", kvcache::KvDtypeName(s.kv_dtype)},
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
       {{"scope", tenant == nullptr ? "all" : "tenant"},
        {"num_running", num_running},
        {"num_waiting", num_waiting},
        {"running", std::move(running)},
        {"waiting", std::move(waiting)}}},
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
  json tiers = json::array();
  for (const engine::KvStateTier& t : s.tiers) {
    tiers.push_back({{"name", t.name},
                     // Where prompts are stored: an admin's view only.
                     {"path", tenant == nullptr ? t.path : ""},
                     {"healthy", t.healthy},
                     {"blocks", t.blocks},
                     {"bytes", t.bytes},
                     {"capacity_bytes", t.capacity_bytes},
                     {"loading_requests", t.loading_requests},
                     {"hits", t.hits},
                     {"misses", t.misses},
                     {"stores", t.stores},
                     {"stores_dropped", t.stores_dropped},
                     {"evictions", t.evictions},
                     {"errors", t.errors},
                     {"loads", t.loads}});
  }
  j["tiers"] = std::move(tiers);
  return j.dump();
}

}  // namespace kvserve::server
