// SwapSpace: the bookkeeping of host swap slots, each holding one KV block
// while its request is swapped out. It owns which slots are free, never the
// bytes (engine/'s backend does) nor which request holds what
// (KvCacheManager does).
//
// Slots are handed out lowest id first from a LIFO free stack (a freed slot
// is reused first: warm host memory), in O(1) per slot.
//
// Invariants (CheckInvariants): the stack holds exactly the free slots, each
// once; num_free() + num_used() == num_slots().
//
// Thread safety: none. Engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvserve::kvcache {

using SwapSlot = int32_t;

class SwapSpace {
 public:
  // All slots start free. Precondition: num_slots >= 0 (KV_CHECKed).
  explicit SwapSpace(int32_t num_slots);

  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;

  // Takes `n` free slots. Precondition: 0 <= n <= num_free() (KV_CHECKed).
  [[nodiscard]] std::vector<SwapSlot> Allocate(int32_t n);
  // Returns slots to the free stack. Precondition: each is in use
  // (KV_CHECKed).
  void Free(absl::Span<const SwapSlot> slots);

  [[nodiscard]] bool is_free(SwapSlot slot) const;
  [[nodiscard]] int32_t num_slots() const {
    return static_cast<int32_t>(is_free_.size());
  }
  [[nodiscard]] int32_t num_free() const {
    return static_cast<int32_t>(free_.size());
  }
  [[nodiscard]] int32_t num_used() const { return num_slots() - num_free(); }

  [[nodiscard]] absl::Status CheckInvariants() const;

 private:
  std::vector<SwapSlot> free_;  // back = next handed out
  std::vector<bool> is_free_;
};

}  // namespace kvserve::kvcache
