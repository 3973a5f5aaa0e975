#include "engine/tier_metrics.h"

#include <string>

namespace kvserve::engine {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const prometheus::Labels kDisk = {{"tier", "disk"}};

constexpr const char* kDropNames[kvtier::kNumDropReasons] = {
    "queue_full", "unhealthy", "error"};

prometheus::Gauge* Gauge(prometheus::Registry& r, const std::string& name,
                         const std::string& help) {
  return &BuildGauge().Name(name).Help(help).Register(r).Add(kDisk);
}

prometheus::Counter* Counter(prometheus::Registry& r, const std::string& name,
                             const std::string& help) {
  return &BuildCounter().Name(name).Help(help).Register(r).Add(kDisk);
}

}  // namespace

TierMetrics::TierMetrics(prometheus::Registry& r) {
  bytes_ = Gauge(r, "kvserve_kv_tier_bytes", "Bytes of KV blocks a tier holds");
  capacity_ =
      Gauge(r, "kvserve_kv_tier_capacity_bytes", "Bytes a KV tier may hold");
  blocks_ = Gauge(r, "kvserve_kv_tier_blocks", "KV blocks a tier holds");
  healthy_ = Gauge(r, "kvserve_kv_tier_healthy",
                   "1 while a tier's writes succeed, 0 while they back off "
                   "after an error");
  loading_ = Gauge(r, "kvserve_kv_tier_loading_requests",
                   "Requests waiting for their prefix to load from a tier");
  hits_ = Counter(r, "kvserve_kv_tier_hits_blocks_total",
                  "KV blocks loaded from a tier and verified");
  auto& misses = BuildCounter()
                     .Name("kvserve_kv_tier_misses_total")
                     .Help(
                         "Tier lookups that did not become a hit, by reason "
                         "(absent, checksum, tokens, fingerprint, deadline, "
                         "unavailable)")
                     .Register(r);
  for (int i = 0; i < kvtier::kNumMissReasons; ++i) {
    misses_[i] =
        &misses.Add({{"tier", "disk"},
                     {"reason", std::string(kvtier::MissReasonName(
                                    static_cast<kvtier::MissReason>(i)))}});
  }
  stores_ =
      Counter(r, "kvserve_kv_tier_stores_total", "KV blocks written to a tier");
  auto& dropped = BuildCounter()
                      .Name("kvserve_kv_tier_stores_dropped_total")
                      .Help(
                          "KV blocks not written, by reason (queue_full, "
                          "unhealthy, error)")
                      .Register(r);
  for (int i = 0; i < kvtier::kNumDropReasons; ++i) {
    dropped_[i] = &dropped.Add({{"tier", "disk"}, {"reason", kDropNames[i]}});
  }
  evictions_ = Counter(r, "kvserve_kv_tier_evictions_total",
                       "KV blocks a tier deleted to stay within its bytes");
  errors_ = Counter(r, "kvserve_kv_tier_errors_total",
                    "Failed reads and writes of a tier (the service goes on)");
  loads_ = Counter(r, "kvserve_kv_tier_loads_total",
                   "Requests whose prefix a tier loaded (or tried to)");
  loaded_blocks_ = Counter(r, "kvserve_kv_tier_loaded_blocks_total",
                           "KV blocks tier loads put into the pool");
  auto& skipped = BuildCounter()
                      .Name("kvserve_kv_tier_loads_skipped_total")
                      .Help(
                          "Prompts a tier held but did not load: no_room (no "
                          "free pool blocks to load into), slower (its "
                          "measured load time above the predicted recompute)")
                      .Register(r);
  skipped_no_room_ = &skipped.Add({{"tier", "disk"}, {"reason", "no_room"}});
  skipped_slower_ = &skipped.Add({{"tier", "disk"}, {"reason", "slower"}});
  const prometheus::Histogram::BucketBoundaries buckets = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
      0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5};
  load_seconds_ = &BuildHistogram()
                       .Name("kvserve_kv_tier_load_seconds")
                       .Help("Wall time of one request's tier load")
                       .Register(r)
                       .Add(kDisk, buckets);
  store_seconds_ = &BuildHistogram()
                        .Name("kvserve_kv_tier_store_seconds")
                        .Help("Wall time of writing one KV block to a tier")
                        .Register(r)
                        .Add(kDisk, buckets);
}

void TierMetrics::Advance(prometheus::Counter* c, uint64_t now,
                          uint64_t* last) {
  if (now > *last) c->Increment(static_cast<double>(now - *last));
  *last = now;
}

void TierMetrics::Publish(const KvTierStats& s) {
  const kvtier::DiskTierStats& d = s.disk;
  bytes_->Set(static_cast<double>(d.bytes));
  capacity_->Set(static_cast<double>(d.capacity_bytes));
  blocks_->Set(static_cast<double>(d.blocks));
  healthy_->Set(d.writable ? 1 : 0);
  loading_->Set(static_cast<double>(s.loading_requests));
  Advance(hits_, d.hits, &hits_last_);
  for (int i = 0; i < kvtier::kNumMissReasons; ++i) {
    uint64_t n = d.misses[i];
    if (i == static_cast<int>(kvtier::MissReason::kDeadline)) {
      n += static_cast<uint64_t>(s.load_deadlines);
    }
    Advance(misses_[i], n, &misses_last_[i]);
  }
  Advance(stores_, d.stores, &stores_last_);
  for (int i = 0; i < kvtier::kNumDropReasons; ++i) {
    Advance(dropped_[i], d.stores_dropped[i], &dropped_last_[i]);
  }
  Advance(evictions_, d.evictions, &evictions_last_);
  Advance(errors_, d.errors, &errors_last_);
  Advance(loads_, static_cast<uint64_t>(s.loads), &loads_last_);
  Advance(loaded_blocks_, static_cast<uint64_t>(s.loaded_blocks),
          &loaded_last_);
  Advance(skipped_no_room_, static_cast<uint64_t>(s.skipped_no_room),
          &no_room_last_);
  Advance(skipped_slower_, static_cast<uint64_t>(s.skipped_slower),
          &slower_last_);
}

}  // namespace kvserve::engine
