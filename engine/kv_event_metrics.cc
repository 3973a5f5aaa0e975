#include "engine/kv_event_metrics.h"

#include <string>

namespace kvserve::engine {
namespace {

prometheus::Counter* Counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Gauge* Gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

void KvEventMetrics::Tracked::Advance(int64_t now) {
  const auto n = static_cast<uint64_t>(now);
  if (n > last) counter->Increment(static_cast<double>(n - last));
  last = n;
}

KvEventMetrics::KvEventMetrics(prometheus::Registry& r) {
  batches_.counter = Counter(r, "kvserve_kv_events_batches_total",
                             "KV event batches published (heartbeats too)");
  events_.counter =
      Counter(r, "kvserve_kv_events_events_total", "KV events published");
  heartbeats_.counter = Counter(r, "kvserve_kv_events_heartbeats_total",
                                "Empty KV event batches sent on silence");
  dropped_batches_.counter =
      Counter(r, "kvserve_kv_events_dropped_batches_total",
              "KV event batches dropped: the publisher's queue was full");
  dropped_events_.counter = Counter(r, "kvserve_kv_events_dropped_events_total",
                                    "KV events in dropped batches");
  send_errors_.counter = Counter(r, "kvserve_kv_events_send_errors_total",
                                 "KV event messages ZMQ failed to send");
  replays_.counter =
      Counter(r, "kvserve_kv_events_replays_total", "Replay requests served");
  replayed_batches_.counter =
      Counter(r, "kvserve_kv_events_replayed_batches_total",
              "KV event batches sent by replays");
  stored_.counter = Counter(r, "kvserve_kv_events_stored_blocks_total",
                            "Blocks announced in BlockStored events");
  removed_.counter = Counter(r, "kvserve_kv_events_removed_blocks_total",
                             "Blocks announced in BlockRemoved events");
  unannounced_.counter = Counter(
      r, "kvserve_kv_events_unannounced_blocks_total",
      "Blocks cached under a tenant scope or a cache_salt: not announced");
  engine_seconds_ =
      Counter(r, "kvserve_kv_events_engine_cpu_seconds_total",
              "Engine-thread CPU time spent batching and queuing KV events");
  announced_ = Gauge(r, "kvserve_kv_events_announced_blocks",
                     "Blocks announced as resident and not removed since");
  queued_ = Gauge(r, "kvserve_kv_events_queued_batches",
                  "KV event batches waiting for the publisher thread");
}

void KvEventMetrics::Publish(const KvEventStats& s) {
  batches_.Advance(s.publisher.batches);
  events_.Advance(s.publisher.events);
  heartbeats_.Advance(s.publisher.heartbeats);
  dropped_batches_.Advance(s.publisher.dropped_batches);
  dropped_events_.Advance(s.publisher.dropped_events);
  send_errors_.Advance(s.publisher.send_errors);
  replays_.Advance(s.publisher.replays);
  replayed_batches_.Advance(s.publisher.replayed_batches);
  stored_.Advance(s.stored_blocks);
  removed_.Advance(s.removed_blocks);
  unannounced_.Advance(s.unannounced_blocks);
  if (s.engine_cpu_nanos > engine_nanos_last_) {
    engine_seconds_->Increment(
        1e-9 * static_cast<double>(s.engine_cpu_nanos - engine_nanos_last_));
    engine_nanos_last_ = s.engine_cpu_nanos;
  }
  announced_->Set(static_cast<double>(s.announced_blocks));
  queued_->Set(static_cast<double>(s.publisher.queued));
}

}  // namespace kvserve::engine
