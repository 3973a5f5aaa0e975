// The JSON of GET /v1/kv/state: an engine::KvState snapshot as the /ui page
// and other readers take it (its schema: KvState in
// server/openapi/openapi.json).
#pragma once

#include <string>

#include "engine/kv_state.h"

namespace kvserve::server {

// `tenant` non-null: only that tenant's requests are listed (and counted);
// null: every request, each with its tenant (an admin's view). The pool,
// its grid and the counters are the whole cache's either way.
[[nodiscard]] std::string KvStateJson(const engine::KvState& state,
                                      const std::string& model_name,
                                      const std::string* tenant = nullptr);

}  // namespace kvserve::server
