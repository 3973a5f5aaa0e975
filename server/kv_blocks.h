// GET /v1/kv/blocks (admin): the full blocks of the pool that the KV
// events announce (--kv-events-endpoint), by the hash the events carry, so
// a subscriber can check its index against the daemon's residency:
//
//   {"block_size": 16, "medium": "GPU", "hashes": ["1234...", ...],
//    "unannounced_blocks": 3}
//
// Hashes are unsigned 64-bit integers written as decimal strings (a JSON
// number would lose bits in readers that parse doubles). Blocks of private
// tenant scopes and cache_salts are counted, never listed.
#pragma once

#include <string>

#include "engine/engine.h"

namespace kvserve::server {

[[nodiscard]] std::string KvBlocksJson(const engine::ResidentBlocks& blocks);

}  // namespace kvserve::server
