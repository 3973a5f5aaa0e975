// The two ReservationStrategy implementations: paging and max-length slabs.
#include "scheduler/kv_reservation.h"

#include "kvcache/kv_sizing.h"

namespace kvserve::scheduler {
namespace {

// Blocks are allocated as tokens are computed; cached prefixes are shared.
class PagedReservation final : public ReservationStrategy {
 public:
  explicit PagedReservation(int32_t block_size) : block_size_(block_size) {}
  int64_t AdmissionTokens(int32_t start, int32_t n) const override {
    return int64_t{start} + n;
  }
  int64_t HeldBlocks(int32_t computed) const override {
    return kvcache::BlocksForTokens(computed, block_size_);
  }
  int64_t MostBlocks(int64_t total) const override {
    return kvcache::BlocksForTokens(total, block_size_);
  }
  bool SharesPrefixes() const override { return true; }
  bool Grows() const override { return true; }
  int64_t ForkTokens() const override { return 0; }

 private:
  int32_t block_size_;
};

// Emulated contiguous slabs: ceil(max_model_len / block_size) blocks from
// admission to the end, nothing shared (the baseline paging is measured
// against, docs/PERFORMANCE.md's paging experiment).
class SlabReservation final : public ReservationStrategy {
 public:
  SlabReservation(int64_t slab_blocks, int32_t block_size)
      : slab_blocks_(slab_blocks), block_size_(block_size) {}
  int64_t AdmissionTokens(int32_t, int32_t) const override {
    return slab_blocks_ * block_size_;
  }
  int64_t HeldBlocks(int32_t) const override { return slab_blocks_; }
  int64_t MostBlocks(int64_t) const override { return slab_blocks_; }
  bool SharesPrefixes() const override { return false; }
  bool Grows() const override { return false; }
  int64_t ForkTokens() const override { return slab_blocks_ * block_size_; }

 private:
  int64_t slab_blocks_;
  int32_t block_size_;
};

}  // namespace

std::unique_ptr<const ReservationStrategy> MakeReservation(
    const SchedulerConfig& config) {
  switch (config.kv_reservation) {
    case KvReservation::kMaxLength:
      return std::make_unique<SlabReservation>(config.slab_blocks(),
                                               config.block_size);
    case KvReservation::kPaged:
      break;
  }
  return std::make_unique<PagedReservation>(config.block_size);
}

}  // namespace kvserve::scheduler
