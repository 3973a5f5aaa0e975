#include "server/metrics.h"

#include <string>

namespace kvserve::server {

const char* StatusCodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {
      "OK",
      "CANCELLED",
      "UNKNOWN",
      "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED",
      "NOT_FOUND",
      "ALREADY_EXISTS",
      "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION",
      "ABORTED",
      "OUT_OF_RANGE",
      "UNIMPLEMENTED",
      "INTERNAL",
      "UNAVAILABLE",
      "DATA_LOSS",
      "UNAUTHENTICATED",
  };
  const int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i]
                                                           : "UNKNOWN";
}

ServerMetrics::ServerMetrics(prometheus::Registry& registry)
    : rpcs_(&prometheus::BuildCounter()
                 .Name("kvserve_grpc_requests_total")
                 .Help("gRPC calls handled, by method and status code")
                 .Register(registry)),
      open_streams_(&prometheus::BuildGauge()
                         .Name("kvserve_grpc_open_streams")
                         .Help("Generate streams currently open")
                         .Register(registry)
                         .Add({})) {
  auto& reloads = prometheus::BuildCounter()
                      .Name("kvserve_auth_reloads_total")
                      .Help("Reloads of --auth-token-file (SIGHUP), by result")
                      .Register(registry);
  reload_ok_ = &reloads.Add({{"result", "ok"}});
  reload_failed_ = &reloads.Add({{"result", "failed"}});
}

void ServerMetrics::RpcDone(std::string_view method, grpc::StatusCode code) {
  rpcs_->Add({{"method", std::string(method)}, {"code", StatusCodeName(code)}})
      .Increment();
}

}  // namespace kvserve::server
