#include "engine/tier_metrics.h"

#include <string>

namespace kvserve::engine {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

constexpr const char* kDropNames[kvtier::kNumDropReasons] = {
    "queue_full", "unhealthy", "error"};

const prometheus::Histogram::BucketBoundaries& Buckets() {
  static const prometheus::Histogram::BucketBoundaries b = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5};
  return b;
}

prometheus::Gauge* Gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help,
                         const prometheus::Labels& labels) {
  return &BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Counter* Counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help,
                             const prometheus::Labels& labels) {
  return &BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

// Adds the growth of `now` over `*last` to `c`.
void Advance(prometheus::Counter* c, uint64_t now, uint64_t* last) {
  if (now > *last) c->Increment(static_cast<double>(now - *last));
  *last = now;
}

}  // namespace

TierMetrics::Series::Series(prometheus::Registry& r, const char* tier) {
  const prometheus::Labels l = {{"tier", tier}};
  bytes = Gauge(r, "kvserve_kv_tier_bytes",
                "Bytes of KV blocks a tier holds (remote: the store's "
                "used_memory)",
                l);
  capacity = Gauge(r, "kvserve_kv_tier_capacity_bytes",
                   "Bytes a KV tier may hold (remote: the store's maxmemory, "
                   "0 for none)",
                   l);
  blocks = Gauge(r, "kvserve_kv_tier_blocks",
                 "KV blocks a tier holds (remote: keys in its database)", l);
  healthy =
      Gauge(r, "kvserve_kv_tier_healthy",
            "1 while a tier works, 0 while it backs off after an error", l);
  hits = Counter(r, "kvserve_kv_tier_hits_blocks_total",
                 "KV blocks loaded from a tier and verified", l);
  auto& m = BuildCounter()
                .Name("kvserve_kv_tier_misses_total")
                .Help(
                    "Tier lookups that did not become a hit, by reason "
                    "(absent, checksum, tokens, fingerprint, deadline, "
                    "unavailable)")
                .Register(r);
  for (int i = 0; i < kvtier::kNumMissReasons; ++i) {
    misses[i] = &m.Add({{"tier", tier},
                        {"reason", std::string(kvtier::MissReasonName(
                                       static_cast<kvtier::MissReason>(i)))}});
  }
  stores = Counter(r, "kvserve_kv_tier_stores_total",
                   "KV blocks written to a tier", l);
  auto& d = BuildCounter()
                .Name("kvserve_kv_tier_stores_dropped_total")
                .Help(
                    "KV blocks not written, by reason (queue_full, "
                    "unhealthy, error)")
                .Register(r);
  for (int i = 0; i < kvtier::kNumDropReasons; ++i) {
    dropped[i] = &d.Add({{"tier", tier}, {"reason", kDropNames[i]}});
  }
  evictions = Counter(r, "kvserve_kv_tier_evictions_total",
                      "KV blocks a tier deleted to stay within its bytes", l);
  errors = Counter(r, "kvserve_kv_tier_errors_total",
                   "Failed reads, writes or commands of a tier (the service "
                   "goes on)",
                   l);
  store_seconds = &BuildHistogram()
                       .Name("kvserve_kv_tier_store_seconds")
                       .Help("Wall time of writing one KV block to a tier")
                       .Register(r)
                       .Add(l, Buckets());
}

void TierMetrics::Series::Publish(const kvtier::TierStats& s,
                                  uint64_t deadlines) {
  bytes->Set(static_cast<double>(s.bytes));
  capacity->Set(static_cast<double>(s.capacity_bytes));
  blocks->Set(static_cast<double>(s.blocks));
  healthy->Set(s.healthy ? 1 : 0);
  Advance(hits, s.hits, &hits_last);
  for (int i = 0; i < kvtier::kNumMissReasons; ++i) {
    uint64_t n = s.misses[i];
    if (i == static_cast<int>(kvtier::MissReason::kDeadline)) n += deadlines;
    Advance(misses[i], n, &misses_last[i]);
  }
  Advance(stores, s.stores, &stores_last);
  for (int i = 0; i < kvtier::kNumDropReasons; ++i) {
    Advance(dropped[i], s.stores_dropped[i], &dropped_last[i]);
  }
  Advance(evictions, s.evictions, &evictions_last);
  Advance(errors, s.errors, &errors_last);
}

TierMetrics::TierMetrics(prometheus::Registry& r, bool host, bool disk,
                         bool remote) {
  if (host) series_[kHost].emplace(r, "host");
  if (disk) series_[kDisk].emplace(r, "disk");
  if (remote) series_[kRemote].emplace(r, "remote");
  loading_ =
      Gauge(r, "kvserve_kv_tier_loading_requests",
            "Requests waiting for their prefix to load from the tiers", {});
  engine_cpu_ = Counter(r, "kvserve_kv_tier_engine_cpu_seconds_total",
                        "Engine thread CPU time spent in the KV tiers' calls "
                        "(admission lookups, finished loads, write-through "
                        "copies)",
                        {});
  loads_ = Counter(r, "kvserve_kv_tier_loads_total",
                   "Requests whose prefix the tiers loaded (or tried to)", {});
  loaded_blocks_ = Counter(r, "kvserve_kv_tier_loaded_blocks_total",
                           "KV blocks tier loads put into the pool", {});
  auto& skipped = BuildCounter()
                      .Name("kvserve_kv_tier_loads_skipped_total")
                      .Help(
                          "Prompts the tiers held but did not load: no_room "
                          "(no free pool blocks to load into), slower (the "
                          "measured load time above the predicted recompute)")
                      .Register(r);
  skipped_no_room_ = &skipped.Add({{"reason", "no_room"}});
  skipped_slower_ = &skipped.Add({{"reason", "slower"}});
  load_seconds_ = &BuildHistogram()
                       .Name("kvserve_kv_tier_load_seconds")
                       .Help("Wall time of one request's tier load")
                       .Register(r)
                       .Add({}, Buckets());
}

void TierMetrics::Publish(const KvTierStats& s) {
  if (series_[kHost]) series_[kHost]->Publish(s.host, 0);
  if (series_[kDisk]) {
    series_[kDisk]->Publish(s.disk, static_cast<uint64_t>(s.load_deadlines));
  }
  if (series_[kRemote]) {
    series_[kRemote]->Publish(s.remote,
                              static_cast<uint64_t>(s.remote_load_deadlines));
  }
  loading_->Set(static_cast<double>(s.loading_requests));
  if (s.engine_cpu_nanos > engine_cpu_last_) {
    engine_cpu_->Increment(
        1e-9 * static_cast<double>(s.engine_cpu_nanos - engine_cpu_last_));
    engine_cpu_last_ = s.engine_cpu_nanos;
  }
  Advance(loads_, static_cast<uint64_t>(s.loads), &loads_last_);
  Advance(loaded_blocks_, static_cast<uint64_t>(s.loaded_blocks),
          &loaded_last_);
  Advance(skipped_no_room_, static_cast<uint64_t>(s.skipped_no_room),
          &no_room_last_);
  Advance(skipped_slower_, static_cast<uint64_t>(s.skipped_slower),
          &slower_last_);
}

}  // namespace kvserve::engine
