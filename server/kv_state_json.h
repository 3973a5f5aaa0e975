// The JSON of GET /v1/kv/state: an engine::KvState snapshot as the /ui page
// and other readers take it (its schema: KvState in
// server/openapi/openapi.json).
#pragma once

#include <string>

#include "engine/kv_state.h"

namespace kvserve::server {

[[nodiscard]] std::string KvStateJson(const engine::KvState& state,
                                      const std::string& model_name);

}  // namespace kvserve::server
