// POST /v1/kv/purge (admin): deletes a tenant's, a cache scope's or a
// cache_salt's KV blocks from the tiers below the pool (disk, remote).
//
//   {"tenant": "alice"}                      the tenant's private scope
//   {"cache_scope": "scope:team"}            a scope by its key
//   {"tenant": "alice", "cache_salt": "s1"}  one salt within the scope
//   {"all": true}                            every block of this model
//
// Answer: {"purged": {"device": D, "host": H, "disk": N, "remote": M}}:
// the pool's unreferenced cached blocks of the scope stop being findable
// too (blocks in use stay with their requests).
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/engine.h"

namespace kvserve::server {

struct KvPurgeRequest {
  std::optional<std::string> cache_scope;  // nullopt: every scope
  std::optional<std::string> cache_salt;
};

// InvalidArgument naming the field: not a JSON object, none or several of
// tenant / cache_scope / all, a cache_salt without a scope, wrong types.
[[nodiscard]] absl::StatusOr<KvPurgeRequest> ParseKvPurge(
    absl::string_view body);
[[nodiscard]] std::string KvPurgeJson(const engine::KvTierPurge& p);

}  // namespace kvserve::server
