// Software prefetch of the CPU attention's next KV tile
// (models/cpu/paged_attention.cc): the pages are scattered, so the hardware
// prefetcher cannot find the next tile on its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "hwy/base.h"

namespace kvserve::models::cpu_attn {

// The next tile's K and V lines, requested a few at a time while this tile
// is folded (Step() from the score and accumulate loops). A burst of all of
// them at the tile's start fills the core's miss queues and stalls it until
// the next tile is in, which serializes reading and arithmetic; spread out,
// they overlap.
class TilePrefetcher {
 public:
  // Rows rows[0, n) of the planes, bytes [b0, b1) of each; spread over
  // about `calls` calls of Step().
  void Reset(const std::byte* k, const std::byte* v, const int64_t* rows, int n,
             int64_t b0, int64_t b1, int64_t calls) {
    k_ = k, v_ = v, rows_ = rows, n_ = n, b0_ = b0, b1_ = b1;
    t_ = 0, b_ = b0;
    const int64_t lines = n * ((b1 - b0 + kLine - 1) / kLine);
    per_call_ = static_cast<int>(std::max<int64_t>(
        1, (lines + calls - 1) / std::max<int64_t>(1, calls)));
  }
  HWY_INLINE void Step() {
    for (int i = 0; i < per_call_ && Next(); ++i) {
    }
  }
  void Finish() {
    while (Next()) {
    }
  }

 private:
  static constexpr int64_t kLine = 64;
  HWY_INLINE bool Next() {
    if (t_ >= n_) return false;
    __builtin_prefetch(k_ + rows_[t_] + b_);
    __builtin_prefetch(v_ + rows_[t_] + b_);
    b_ += kLine;
    if (b_ >= b1_) {
      b_ = b0_;
      ++t_;
    }
    return true;
  }
  const std::byte *k_ = nullptr, *v_ = nullptr;
  const int64_t* rows_ = nullptr;
  int n_ = 0, t_ = 0, per_call_ = 1;
  int64_t b0_ = 0, b1_ = 0, b_ = 0;
};

}  // namespace kvserve::models::cpu_attn
