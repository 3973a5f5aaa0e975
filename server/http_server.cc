#include "server/http_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "prometheus/text_serializer.h"

namespace kvserve::server {

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const Options& options, std::shared_ptr<prometheus::Registry> registry,
    std::function<bool()> ready,
    const std::function<void(httplib::Server*)>& add_routes) {
  std::unique_ptr<HttpServer> http(new HttpServer());
  http->registry_ = std::move(registry);
  http->ready_ = std::move(ready);
  http->server_ = std::make_unique<httplib::Server>();
  const int threads = options.threads;
  http->server_->new_task_queue = [threads] {
    return new httplib::ThreadPool(threads);
  };
  http->Routes();
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
