#include "server/kv_purge.h"

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvserve::server {

using json = nlohmann::json;

absl::StatusOr<KvPurgeRequest> ParseKvPurge(absl::string_view body) {
  const json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("body: must be a JSON object");
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "tenant" && key != "cache_scope" && key != "cache_salt" &&
        key != "all") {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ": unknown field (tenant, cache_scope, cache_salt, all)"));
    }
    if (key == "all" ? !value.is_boolean() : !value.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, key == "all" ? ": must be true" : ": must be a string"));
    }
  }
  const bool all = j.value("all", false);
  const int chosen = static_cast<int>(j.contains("tenant")) +
                     static_cast<int>(j.contains("cache_scope")) +
                     static_cast<int>(all);
  if (chosen != 1) {
    return absl::InvalidArgumentError(
        "tenant, cache_scope, all: give exactly one");
  }
  KvPurgeRequest r;
  if (j.contains("tenant")) {
    const std::string t = j["tenant"].get<std::string>();
    if (t.empty()) return absl::InvalidArgumentError("tenant: empty");
    r.cache_scope = absl::StrCat("tenant:", t);
  } else if (j.contains("cache_scope")) {
    r.cache_scope = j["cache_scope"].get<std::string>();
  }
  if (j.contains("cache_salt")) {
    if (all) {
      return absl::InvalidArgumentError(
          "cache_salt: needs tenant or cache_scope (salts are per scope)");
    }
    r.cache_salt = j["cache_salt"].get<std::string>();
  }
  return r;
}

std::string KvPurgeJson(const engine::KvTierPurge& p) {
  return json{{"purged",
               {{"device", p.device_blocks},
                {"host", p.host_blocks},
                {"disk", p.disk_blocks},
                {"remote", p.remote_blocks}}}}
      .dump();
}

}  // namespace kvserve::server
