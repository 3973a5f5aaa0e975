// The running daemon: the Prometheus registry, the HTTP server (/metrics,
// /health, /ready, and the OpenAI-compatible /v1 API), the loaded model and
// engine, and the gRPC server
// (kvserve.v1.KvServe, grpc.health.v1.Health, server reflection). Owns
// their start-up order and the drain on shutdown. Does not own flags or
// signals (cli_serve.h does).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/registry.h"
#include "server/auth.h"
#include "server/grpc_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/readiness.h"
#include "server/reflection_v1.h"
#include "server/tls.h"

namespace kvserve::server {

struct ServeOptions {
  std::string model = "smollm2-135m";
  // The names the OpenAI API serves the model under, ','-separated: the
  // first is listed by /v1/models and set in responses; empty: `model`.
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 50051;                 // gRPC; 0: pick a free port
  int metrics_port = 9090;          // HTTP; 0: pick a free port
  int http_threads = 2;             // HTTP I/O threads (streams hold none)
  int http_max_connections = 4096;  // beyond: 429 but for the probes
  // HTTP Host names accepted beside the bound address's (http_checks.h);
  // "*": any.
  std::vector<std::string> allowed_hosts;
  engine::EngineConfig engine;
  float rope_scale = 1.0f;  // --rope-scale (engine::LoadModel)
  // Not ready while requests wait and no step completed for this long.
  absl::Duration stall_timeout = absl::Seconds(30);  // 0: never
  RequestLimits limits;
  // Security (docs/SECURITY.md).
  TlsOptions tls;               // both listeners; empty cert: plaintext
  std::string auth_token_file;  // non-empty: bearer tokens required
  // What a tenant's line leaves out, and the single tenant's policy
  // without a token file (server/tenants.h).
  TenantDefaults tenant_defaults;
  bool auth_metrics = false;            // /metrics needs a token too
  int64_t max_request_bytes = 4 << 20;  // gRPC message / HTTP body
  int max_concurrent_streams = 0;       // per gRPC connection; 0: gRPC default
  // Non-empty: --model resolves only inside these
  // (models/loader/model_resolver.h).
  std::vector<std::string> model_dirs;
};

class Daemon {
 public:
  // Start-up order: HTTP first (so /health answers and /ready says 503
  // while the model loads), then the model and engine, then gRPC; ready
  // once all are up. UNAVAILABLE when a port cannot be bound; the model
  // loader's and engine's errors otherwise.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Daemon>> Start(
      const ServeOptions& options);
  ~Daemon();  // Shutdown(zero timeout) if not done yet

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_->port(); }
  bool ready() const { return ready_.load() && !stalled_.load(); }

  // The drain: readiness false, health NOT_SERVING, the engine stops
  // admitting (new Generate calls get UNAVAILABLE) and finishes in-flight
  // requests for up to `drain_timeout`, cancelling the rest; then the gRPC
  // and HTTP servers stop. Blocks until done. Call once, from one thread.
  void Shutdown(absl::Duration drain_timeout);

  // Reads --auth-token-file again (SIGHUP): new tokens and tenant policies
  // apply to requests from now on; on error the tokens in use stay. Logged
  // and counted (kvserve_auth_reloads_total{result}). No-op without a
  // token file.
  void ReloadTokens();

 private:
  Daemon() = default;
  [[nodiscard]] absl::Status CheckSecurity(const ServeOptions& options);
  [[nodiscard]] absl::Status StartEngine(const ServeOptions& options);
  [[nodiscard]] absl::Status StartGrpc(const ServeOptions& options);

  // Declaration order is destruction order reversed: the gRPC server goes
  // first, the engine after every reactor that refers to it.
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<BearerAuth> auth_;  // null: authentication off
  TenantRef single_tenant_;           // every request's, when auth_ is null
  std::string model_path_;            // --model, resolved
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<KvServeService> service_;
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<OpenAiApi> openai_;
  std::atomic<OpenAiApi*> openai_live_{nullptr};  // set once ready
  std::unique_ptr<grpc::Server> grpc_server_;
  int grpc_port_ = 0;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stalled_{false};         // set by watchdog_
  std::unique_ptr<StallWatchdog> watchdog_;  // last: stopped first
  bool shut_down_ = false;
};

// "host:port", with IPv6 hosts in brackets.
[[nodiscard]] std::string HostPort(const std::string& host, int port);

}  // namespace kvserve::server
