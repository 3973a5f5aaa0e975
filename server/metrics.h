// Server-side Prometheus metrics: RPCs handled by method and status code,
// and open Generate streams. The engine registers its own metrics (KV
// blocks, preemptions, latencies) in the same registry; see
// engine/engine_metrics.h. Thread-safe (prometheus-cpp metrics are).
#pragma once

#include <string_view>

#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace kvserve::server {

// "OK", "INVALID_ARGUMENT", ... (gRPC's canonical names).
[[nodiscard]] const char* StatusCodeName(grpc::StatusCode code);

class ServerMetrics {
 public:
  explicit ServerMetrics(prometheus::Registry& registry);

  // One RPC finished with `code`. `method` is the RPC's short name.
  void RpcDone(std::string_view method, grpc::StatusCode code);
  void StreamOpened() { open_streams_->Increment(); }
  void StreamClosed() { open_streams_->Decrement(); }
  // A reload of the token file (SIGHUP) that took effect or failed.
  void TokensReloaded(bool ok) {
    (ok ? reload_ok_ : reload_failed_)->Increment();
  }

 private:
  prometheus::Family<prometheus::Counter>* rpcs_;
  prometheus::Counter *reload_ok_, *reload_failed_;
  prometheus::Gauge* open_streams_;
};

}  // namespace kvserve::server
