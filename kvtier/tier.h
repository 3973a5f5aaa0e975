// What every KV tier shares: the block handed down to be stored, and what a
// tier counts, in one shape, so the engine publishes the disk and the
// remote tier under the same metric names (tier="disk"|"remote").
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/block_codec.h"

namespace kvserve::kvtier {

// One block to store: its header (the checksum is the writer's) and its
// payload, shared by the tiers that write it: the bytes stay valid (and
// unchanged) while `owner` lives, and the last item copy that lets go of
// it releases them (a buffer, or a host cache slot's pin).
struct StoreItem {
  BlockHeader header;
  uint64_t scope_tag = 0;
  absl::Span<const uint8_t> payload;
  std::shared_ptr<const void> owner;
};

// A change to what a tier holds, for KV events (engine/kv_events.h): a block
// this process stored (its header: key, parent, namespace, tokens), or a key
// that left the tier (only `header.key` is set).
struct TierChange {
  bool stored = false;
  BlockHeader header;
};

// One block to load: what it must verify against and where its payload
// goes (lent memory), from the disk or the remote tier.
struct LoadBlock {
  Key key = 0;
  Key parent = 0;
  std::vector<int32_t> tokens;
  std::vector<Piece> dst;
  bool remote = false;  // from the remote tier, else the disk
};

// Why a block handed to a tier was not stored.
enum class DropReason { kQueueFull, kUnhealthy, kError };
inline constexpr int kNumDropReasons = 3;

struct TierStats {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  uint64_t capacity_bytes = 0;
  bool healthy = true;  // false while the tier backs off after an error
  uint64_t queued = 0;
  uint64_t hits = 0;
  std::array<uint64_t, kNumMissReasons> misses{};
  uint64_t stores = 0;
  std::array<uint64_t, kNumDropReasons> stores_dropped{};
  uint64_t evictions = 0;
  uint64_t errors = 0;  // failed system calls or commands
  uint64_t indexed_at_start = 0;
  double index_seconds = 0;
};

// A tier's Flush: waits (under `lock`, woken through `idle`) until its
// writer has taken every item of `queue` and `writing` is false, up to
// `deadline`; what is still queued then is dropped. Returns how many.
int64_t DrainWriteQueue(std::unique_lock<std::mutex>& lock,
                        std::condition_variable& idle,
                        std::deque<StoreItem>& queue, const bool& writing,
                        absl::Time deadline);

}  // namespace kvserve::kvtier
