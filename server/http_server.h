// The HTTP side of the daemon (Boost.Beast on --http-port, alias
// --metrics-port):
//   GET /metrics  Prometheus text exposition of the registry
//   GET /health   200 while the process runs
//   GET /ready    200 when the model is loaded, work is accepted, and the
//                 server is not draining; 503 otherwise
// plus the routes the caller adds (the OpenAI-compatible API,
// openai_api.h).
//
// Owns the listening socket, the I/O threads, every connection, HTTPS
// (Options.tls), the bearer-token check (everything but /health, /ready, the
// static /ui page, and /metrics unless Options.auth_metrics), and the
// body-size limit. Does
// not own the registry's metrics or the readiness decision (the caller
// passes a predicate).
//
// Threading: fully asynchronous. --http-threads I/O threads run every
// connection; a connection's work runs on its own strand, so a handler and
// the completions of its connection never run concurrently. A streaming
// response holds a socket and a few buffers, no thread: a thousand streams
// cost memory, not threads (the load test that chose Beast over cpp-httplib
// is in docs/PERFORMANCE.md). Handlers must not block.
//
// Checks run after the request headers arrive and before the body is read
// (framing, Host and Content-Type: http_checks.h, then the token, then the
// size): an unauthenticated client never makes the server read its body, a
// Content-Length over the limit is answered 413 unread, and a chunked body
// is read only up to the limit (413 beyond it). Answers that leave a body
// unread close the connection. Deadlines: request headers and body within
// 30 s, keep-alive connections close after 5 s idle, and a response write
// that makes no progress for 60 s closes the connection (a client that
// stopped reading cannot pin a stream forever).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/registry.h"
#include "server/auth.h"
#include "server/tls.h"

namespace kvserve::server {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower
  // Who sent it: the bearer token's tenant, or the server's single tenant
  // without tokens; null on the open routes (probes, /ui) and in servers
  // built without one.
  TenantRef tenant;

  // The value of header `name` (lower case), or null.
  [[nodiscard]] const std::string* Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;  // ignored by HttpExchange::StartStream
  std::vector<std::pair<std::string, std::string>> headers;
};

// One request and its response. Every method is thread-safe and returns at
// once: the work is queued on the connection's strand. Callbacks run there
// (on an I/O thread) and never inside the call that registered them. After
// the connection is gone, calls do nothing.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;

  // A whole response; ends the exchange.
  virtual void Respond(HttpResponse response) = 0;
  // Starts a streamed response (chunked transfer encoding): `head`'s
  // status, content type and headers.
  virtual void StartStream(HttpResponse head) = 0;
  // Queues one piece of a streamed response. `sent(true)` runs once it is
  // written, `sent(false)` if the connection failed or closed first.
  virtual void Write(std::string data, std::function<void(bool)> sent) = 0;
  // Ends a streamed response (after everything queued is written).
  virtual void EndStream() = 0;
  // `closed` runs once if the client goes away (or a write fails) before
  // the exchange ends; at once if that already happened.
  virtual void OnClose(std::function<void()> closed) = 0;
  // Runs `f` on the connection's strand.
  virtual void Run(std::function<void()> f) = 0;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

// Method + exact path -> handler. A known path with another method gets
// 405; an unknown path goes to the fallback (default: 404).
class HttpRoutes {
 public:
  void Add(const std::string& method, const std::string& path,
           HttpHandler handler);
  void SetFallback(HttpHandler handler) { fallback_ = std::move(handler); }

  // The route for `request`, or null with `*allowed` set to the methods the
  // path has (empty: unknown path).
  [[nodiscard]] const HttpHandler* Find(const HttpRequest& request,
                                        std::string* allowed) const;
  const HttpHandler& fallback() const { return fallback_; }
  // True if some method is routed at `path`.
  [[nodiscard]] bool HasPath(const std::string& path) const {
    return by_path_.contains(path);
  }

 private:
  std::map<std::string, std::map<std::string, HttpHandler>> by_path_;
  HttpHandler fallback_;
};

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 9090;  // 0: pick a free port
    int threads = 2;  // I/O threads
    // Open connections beyond this get 429 for everything but the probes
    // (/health, /ready, /metrics), and are closed.
    int max_connections = 4096;
    TlsOptions tls;                    // enabled(): HTTPS
    const BearerAuth* auth = nullptr;  // not owned; null: no auth
    TenantRef single_tenant;    // every request's tenant when auth is null
    bool auth_metrics = false;  // /metrics needs the token too
    // Host header names accepted beside the bound address's own
    // (http_checks.h); "*": any.
    std::vector<std::string> allowed_hosts;
    int64_t max_request_bytes = 0;  // body limit; 0: 64 MiB
  };

  // Binds and starts serving. UNAVAILABLE names the address when it cannot
  // bind; InvalidArgument names the TLS flag whose file does not load.
  // `options.auth` must outlive the server. `ready` must be thread-safe.
  // `add_routes` (may be null) registers more routes before the server
  // listens.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const Options& options, std::shared_ptr<prometheus::Registry> registry,
      std::function<bool()> ready,
      const std::function<void(HttpRoutes&)>& add_routes = nullptr);

  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port (the picked one when Options.port was 0).
  int port() const { return port_; }
  // Stops accepting; with a `grace`, lets the responses in progress finish
  // for up to that long (each connection closes after its current response,
  // idle ones at once); then closes every connection and joins the I/O
  // threads. Exchanges still held elsewhere do nothing afterwards.
  // Idempotent.
  void Stop(absl::Duration grace = absl::ZeroDuration());

  struct Core;  // the I/O context, listener and connections (.cc)

 private:
  HttpServer() = default;

  std::shared_ptr<Core> core_;
  int port_ = 0;
};

}  // namespace kvserve::server
