// Prometheus metrics of the KV event stream (engine/kv_events.h): batches
// and events published, heartbeats, batches dropped on a full queue, send
// errors, replays served, and the blocks announced now. Publish turns the
// relay's cumulative counts into counter increments (engine thread); the
// HTTP thread collects.
#pragma once

#include <cstdint>

#include "engine/kv_events.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace kvserve::engine {

class KvEventMetrics {
 public:
  explicit KvEventMetrics(prometheus::Registry& registry);
  void Publish(const KvEventStats& s);

 private:
  struct Tracked {
    prometheus::Counter* counter = nullptr;
    uint64_t last = 0;
    void Advance(int64_t now);
  };
  Tracked batches_, events_, heartbeats_, dropped_batches_, dropped_events_,
      send_errors_, replays_, replayed_batches_, stored_, removed_,
      unannounced_;
  prometheus::Counter* engine_seconds_ = nullptr;
  int64_t engine_nanos_last_ = 0;
  prometheus::Gauge* announced_ = nullptr;
  prometheus::Gauge* queued_ = nullptr;
};

}  // namespace kvserve::engine
