// The HTTP side of the daemon (cpp-httplib on --metrics-port):
//   GET /metrics  Prometheus text exposition of the registry
//   GET /health   200 while the process runs
//   GET /ready    200 when the model is loaded, work is accepted, and the
//                 server is not draining; 503 otherwise
// plus the routes the caller adds (the OpenAI-compatible API,
// openai_api.h).
// Owns the listening socket and its threads, HTTPS (Options.tls), the
// bearer-token check of /v1/* (and /metrics when asked; /health and /ready
// stay open for probes), and the request-size limit. Does not own the
// registry's metrics or the readiness decision (the caller passes a
// predicate).
//
// Checks run in httplib's pre-routing handler, before the body is read:
// an unauthenticated client never makes the server read its body (the
// answer closes the connection), a Content-Length over the limit is
// discarded unparsed and answered 413, and chunked bodies (which httplib
// 0.11 does not bound) are refused with 411. Each HTTP/1.1
// connection is served by one worker thread at a time (requests on it are
// sequential); keep-alive connections are closed after 5 s idle or 5
// requests (httplib's defaults), so one client cannot hold a worker long.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"
#include "server/auth.h"
#include "server/tls.h"

namespace httplib {
class Server;
}

namespace kvserve::server {

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 9090;  // 0: pick a free port
    int threads = 2;
    TlsOptions tls;                    // enabled(): HTTPS
    const BearerAuth* auth = nullptr;  // not owned; null: no auth
    bool auth_metrics = false;         // /metrics needs the token too
    int64_t max_request_bytes = 0;     // body limit; 0: unlimited
  };

  // Binds and starts serving on a background thread. UNAVAILABLE names the
  // address when it cannot bind; InvalidArgument names the TLS flag whose
  // file does not load. `options.auth` must outlive the server. `ready` must be
  // thread-safe. `add_routes` (may be null) registers more routes before the
  // server listens.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const Options& options, std::shared_ptr<prometheus::Registry> registry,
      std::function<bool()> ready,
      const std::function<void(httplib::Server*)>& add_routes = nullptr);

  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port (the picked one when Options.port was 0).
  int port() const { return port_; }
  // Stops accepting and joins the serving thread. Idempotent.
  void Stop();

 private:
  HttpServer() = default;
  void Routes();
  void Guard(const Options& options);

  std::unique_ptr<httplib::Server> server_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::function<bool()> ready_;
  std::thread thread_;
  std::atomic<bool> listen_returned_{false};
  int port_ = 0;
};

}  // namespace kvserve::server
