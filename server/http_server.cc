#include "server/http_server.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "prometheus/text_serializer.h"
#include "server/openai_json.h"

namespace kvserve::server {
namespace {

// An error in the OpenAI shape; a body the client may still be sending is
// left unread, so the connection is closed after the answer.
void Refuse(const httplib::Request& req, httplib::Response& res, int status,
            const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
  if (req.has_header("Content-Length") || req.has_header("Transfer-Encoding")) {
    res.set_header("Connection", "close");
  }
}

std::string TooLargeBody(int64_t limit, uint64_t got) {
  const nlohmann::json j = {
      {"error",
       {{"message",
         absl::StrCat("request body: ", got, " bytes, over the limit of ",
                      limit, " bytes (--max-request-bytes)")},
        {"type", "invalid_request_error"},
        {"param", nullptr},
        {"code", "request_too_large"}}}};
  return j.dump();
}

std::string LengthRequiredBody(int64_t limit) {
  const nlohmann::json j = {
      {"error",
       {{"message",
         absl::StrCat("request body: Transfer-Encoding is not accepted; send "
                      "Content-Length (at most ",
                      limit, " bytes, --max-request-bytes)")},
        {"type", "invalid_request_error"},
        {"param", nullptr},
        {"code", "length_required"}}}};
  return j.dump();
}

std::unique_ptr<httplib::Server> MakeServer(const TlsOptions& tls,
                                            std::string* error) {
  if (!tls.enabled()) return std::make_unique<httplib::Server>();
  auto server = std::make_unique<httplib::SSLServer>(
      [&tls, error](SSL_CTX& ctx) { return SetUpSslContext(tls, ctx, error); });
  if (!server->is_valid()) return nullptr;
  return server;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const Options& options, std::shared_ptr<prometheus::Registry> registry,
    std::function<bool()> ready,
    const std::function<void(httplib::Server*)>& add_routes) {
  std::unique_ptr<HttpServer> http(new HttpServer());
  http->registry_ = std::move(registry);
  http->ready_ = std::move(ready);
  std::string tls_error;
  http->server_ = MakeServer(options.tls, &tls_error);
  if (http->server_ == nullptr) {
    return absl::InvalidArgumentError(
        tls_error.empty() ? "TLS: cannot set up the HTTPS listener"
                          : tls_error);
  }
  const int threads = options.threads;
  http->server_->new_task_queue = [threads] {
    return new httplib::ThreadPool(threads);
  };
  http->Routes();
  http->Guard(options);
  if (add_routes) add_routes(http->server_.get());
  if (options.port == 0) {
    http->port_ = http->server_->bind_to_any_port(options.host);
  } else if (http->server_->bind_to_port(options.host, options.port)) {
    http->port_ = options.port;
  } else {
    http->port_ = -1;
  }
  if (http->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "--metrics-port: cannot listen on ", options.host, ":", options.port));
  }
  HttpServer* self = http.get();
  http->thread_ = std::thread([self] {
    self->server_->listen_after_bind();
    self->listen_returned_.store(true);
  });
  return http;
}

void HttpServer::Routes() {
  server_->Get(
      "/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(
            prometheus::TextSerializer().Serialize(registry_->Collect()),
            "text/plain; version=0.0.4; charset=utf-8");
      });
  server_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  server_->Get(
      "/ready", [this](const httplib::Request&, httplib::Response& res) {
        const bool ready = ready_();
        res.status = ready ? 200 : 503;
        res.set_content(ready ? "ready\n" : "not ready\n", "text/plain");
      });
}

void HttpServer::Guard(const Options& options) {
  const BearerAuth* auth = options.auth;
  const bool auth_metrics = options.auth_metrics;
  const int64_t limit = options.max_request_bytes;
  if (limit > 0) server_->set_payload_max_length(static_cast<size_t>(limit));
  if (auth == nullptr && limit <= 0) return;
  server_->set_pre_routing_handler(
      [auth, auth_metrics, limit](const httplib::Request& req,
                                  httplib::Response& res) {
        using R = httplib::Server::HandlerResponse;
        // Probes stay open; everything else (the API, unknown routes) needs
        // the token, so an unauthenticated client learns nothing.
        const bool open = req.path == "/health" || req.path == "/ready" ||
                          (req.path == "/metrics" && !auth_metrics);
        if (auth != nullptr && !open) {
          const absl::Status s =
              auth->CheckAuthorization(req.get_header_value("Authorization"),
                                       req.has_header("Authorization"));
          if (!s.ok()) {
            res.set_header("WWW-Authenticate", "Bearer");
            Refuse(req, res, 401, ToHttpError(s).body);
            return R::Handled;
          }
        }
        if (limit > 0 && req.has_header("Transfer-Encoding")) {
          // cpp-httplib 0.11 does not bound chunked bodies; refuse them.
          Refuse(req, res, 411, LengthRequiredBody(limit));
          return R::Handled;
        }
        if (limit > 0 && req.has_header("Content-Length")) {
          const uint64_t len = std::strtoull(
              req.get_header_value("Content-Length").c_str(), nullptr, 10);
          if (len > static_cast<uint64_t>(limit)) {
            // NOTE: httplib itself answers 413 here after discarding the
            // body (which keeps the connection usable and the client able
            // to finish sending); this only supplies the body of that 413.
            res.set_content(TooLargeBody(limit, len), "application/json");
          }
        }
        return R::Unhandled;
      });
}

void HttpServer::Stop() {
  if (!thread_.joinable()) return;
  // NOTE: httplib's stop() is a no-op until the listen loop has started,
  // which happens right after the thread starts; wait for either.
  while (!server_->is_running() && !listen_returned_.load()) {
    std::this_thread::yield();
  }
  server_->stop();
  thread_.join();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace kvserve::server
