// Prometheus metrics of the KV tiers, one series per tier (tier="host",
// "disk", "remote"): occupancy, health, hits, misses by reason, stores and
// dropped stores by reason, evictions, errors, store latency; and of the loads,
// which span the tiers: requests loading, loads, loaded blocks, loads
// skipped, load latency. Publish turns KvTiers' cumulative counts into
// counter increments; the engine thread calls it, the HTTP thread collects.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "engine/kv_tiers.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kvserve::engine {

class TierMetrics {
 public:
  enum Tier { kDisk = 0, kRemote = 1, kHost = 2 };

  TierMetrics(prometheus::Registry& registry, bool host, bool disk,
              bool remote);

  void Publish(const KvTierStats& s);
  // One load's wall time (any thread).
  void ObserveLoad(double seconds) { load_seconds_->Observe(seconds); }
  // One block written to `tier` (its writer thread).
  void ObserveStore(Tier tier, double seconds) {
    if (series_[tier]) series_[tier]->store_seconds->Observe(seconds);
  }

 private:
  // One tier's series and what its counters last published.
  struct Series {
    Series(prometheus::Registry& r, const char* tier);
    void Publish(const kvtier::TierStats& s, uint64_t deadlines);

    prometheus::Gauge* bytes;
    prometheus::Gauge* capacity;
    prometheus::Gauge* blocks;
    prometheus::Gauge* healthy;
    prometheus::Counter* hits;
    std::array<prometheus::Counter*, kvtier::kNumMissReasons> misses{};
    prometheus::Counter* stores;
    std::array<prometheus::Counter*, kvtier::kNumDropReasons> dropped{};
    prometheus::Counter* evictions;
    prometheus::Counter* errors;
    prometheus::Histogram* store_seconds;
    uint64_t hits_last = 0, stores_last = 0, evictions_last = 0,
             errors_last = 0;
    std::array<uint64_t, kvtier::kNumMissReasons> misses_last{};
    std::array<uint64_t, kvtier::kNumDropReasons> dropped_last{};
  };

  std::array<std::optional<Series>, 3> series_;
  prometheus::Counter* engine_cpu_;
  int64_t engine_cpu_last_ = 0;
  prometheus::Gauge* loading_;
  prometheus::Counter* loads_;
  prometheus::Counter* loaded_blocks_;
  prometheus::Counter* skipped_no_room_;
  prometheus::Counter* skipped_slower_;
  prometheus::Histogram* load_seconds_;
  uint64_t loads_last_ = 0, loaded_last_ = 0, no_room_last_ = 0,
           slower_last_ = 0;
};

}  // namespace kvserve::engine
