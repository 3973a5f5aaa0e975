// KV cache events: what a router learns about a replica's prefix cache, in
// vLLM's wire format (vllm/distributed/kv_events.py), which llm-d's KV cache
// indexer (pkg/kvevents, vllm_adapter.go) and Dynamo's KV router decode.
//
// A batch is a msgpack array [ts (float64 seconds), [events...], dp_rank].
// Events use the positional ("array_like", tag first) form: every llm-d
// release decodes it, while the map form needs llm-d-router from 2026-06 on.
//   BlockStored       ["BlockStored", [hashes], parent|nil, [token ids],
//                      block_size, lora_id (nil), medium, lora_name (nil)]
//   BlockRemoved      ["BlockRemoved", [hashes], medium]
//   AllBlocksCleared  ["AllBlocksCleared"]
// Hashes are unsigned 64-bit integers (vLLM's default,
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): a consumer keys its own index by
// the token ids and uses the engine's hashes only to name blocks (parents,
// removals), so they need only be stable and distinct within one replica.
// An empty batch is the heartbeat (llm-d applies it as a no-op).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kvserve::kvevents {

// Where a block lives; wire names "GPU" (the engine's KV pool on every
// device, as vLLM names it), "CPU" (a host cache below a device pool),
// "STORAGE" (the disk tier).
enum class Medium : uint8_t { kGpu, kCpu, kStorage };
[[nodiscard]] const char* MediumName(Medium medium);

// Consecutive full blocks of one chain: hashes[i]'s parent is hashes[i-1],
// hashes[0]'s is `parent` (nullopt: the first block of a sequence).
// token_ids.size() == hashes.size() * block_size.
struct BlockStored {
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<int32_t> token_ids;
  int32_t block_size = 0;
  Medium medium = Medium::kGpu;
  // vLLM's LoRA adapter name: llm-d keys the blocks under it instead of the
  // topic's model (kvserve puts an opted-in private cache scope here).
  std::optional<std::string> lora_name;
};

struct BlockRemoved {
  std::vector<uint64_t> hashes;
  Medium medium = Medium::kGpu;
};

struct AllBlocksCleared {};

using Event = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

struct EventBatch {
  double ts = 0;  // seconds since the Unix epoch
  std::vector<Event> events;
  int32_t dp_rank = 0;
};

// The batch's msgpack bytes (the publisher's third frame).
[[nodiscard]] std::string EncodeBatch(const EventBatch& batch);

}  // namespace kvserve::kvevents
