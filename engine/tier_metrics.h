// Prometheus metrics of the KV tiers (tier="disk" today; host and remote
// take the same names): occupancy, hits, misses by reason, stores and
// dropped stores by reason, evictions, errors, loads and their latency.
// Publish turns KvTiers' cumulative counts into counter increments; the
// engine thread calls it, the HTTP thread collects.
#pragma once

#include <array>
#include <cstdint>

#include "engine/kv_tiers.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kvserve::engine {

class TierMetrics {
 public:
  explicit TierMetrics(prometheus::Registry& registry);

  void Publish(const KvTierStats& s);
  // One load's wall time (any thread).
  void ObserveLoad(double seconds) { load_seconds_->Observe(seconds); }
  // One block written (the writer thread).
  void ObserveStore(double seconds) { store_seconds_->Observe(seconds); }

 private:
  // Adds the growth of `now` over `*last` to `c`.
  static void Advance(prometheus::Counter* c, uint64_t now, uint64_t* last);

  prometheus::Gauge* bytes_;
  prometheus::Gauge* capacity_;
  prometheus::Gauge* blocks_;
  prometheus::Gauge* healthy_;
  prometheus::Gauge* loading_;
  prometheus::Counter* hits_;
  std::array<prometheus::Counter*, kvtier::kNumMissReasons> misses_{};
  prometheus::Counter* stores_;
  std::array<prometheus::Counter*, kvtier::kNumDropReasons> dropped_{};
  prometheus::Counter* evictions_;
  prometheus::Counter* errors_;
  prometheus::Counter* loads_;
  prometheus::Counter* loaded_blocks_;
  prometheus::Counter* skipped_no_room_;
  prometheus::Counter* skipped_slower_;
  prometheus::Histogram* load_seconds_;
  prometheus::Histogram* store_seconds_;

  // What the counters last published.
  uint64_t hits_last_ = 0, stores_last_ = 0, evictions_last_ = 0,
           errors_last_ = 0, loads_last_ = 0, loaded_last_ = 0,
           no_room_last_ = 0, slower_last_ = 0;
  std::array<uint64_t, kvtier::kNumMissReasons> misses_last_{};
  std::array<uint64_t, kvtier::kNumDropReasons> dropped_last_{};
};

}  // namespace kvserve::engine
