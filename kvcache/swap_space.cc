#include "kvcache/swap_space.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace kvserve::kvcache {

SwapSpace::SwapSpace(int32_t num_slots) {
  KV_CHECK(num_slots >= 0, "num_swap_slots=", num_slots);
  is_free_.assign(num_slots, true);
  free_.reserve(num_slots);
  for (SwapSlot s = num_slots - 1; s >= 0; --s) free_.push_back(s);
}

std::vector<SwapSlot> SwapSpace::Allocate(int32_t n) {
  KV_CHECK(n >= 0 && n <= num_free(), "n=", n, " free slots=", num_free());
  std::vector<SwapSlot> out(free_.end() - n, free_.end());
  std::reverse(out.begin(), out.end());  // lowest id first
  free_.resize(free_.size() - n);
  for (const SwapSlot s : out) is_free_[s] = false;
  return out;
}

void SwapSpace::Free(absl::Span<const SwapSlot> slots) {
  // Reverse order so that Allocate(n) right after hands back the same slots
  // in the same order.
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    const SwapSlot s = *it;
    KV_CHECK(s >= 0 && s < num_slots() && !is_free_[s], "swap slot ", s,
             " freed while free or out of range");
    is_free_[s] = true;
    free_.push_back(s);
  }
}

bool SwapSpace::is_free(SwapSlot slot) const {
  KV_CHECK(slot >= 0 && slot < num_slots(), "swap slot ", slot);
  return is_free_[slot];
}

absl::Status SwapSpace::CheckInvariants() const {
  std::vector<bool> seen(num_slots(), false);
  for (const SwapSlot s : free_) {
    if (s < 0 || s >= num_slots() || seen[s] || !is_free_[s]) {
      return absl::InternalError(
          absl::StrCat("swap free stack holds bad or duplicate slot ", s));
    }
    seen[s] = true;
  }
  for (SwapSlot s = 0; s < num_slots(); ++s) {
    if (seen[s] != is_free_[s]) {
      return absl::InternalError(absl::StrCat(
          "swap slot ", s, " flag=", is_free_[s], " stacked=", seen[s]));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::kvcache
