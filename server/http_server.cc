#include "server/http_server.h"

#include "server/http_internal.h"
// clang-format off: after http_internal.h (its <utility>-first rule)
#include <openssl/ssl.h>

#include <boost/asio/strand.hpp>
// clang-format on

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "prometheus/text_serializer.h"
#include "spdlog/spdlog.h"

namespace kvserve::server {

const std::string* HttpRequest::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return &v;
  }
  return nullptr;
}

void HttpRoutes::Add(const std::string& method, const std::string& path,
                     HttpHandler handler) {
  by_path_[path][method] = std::move(handler);
}

const HttpHandler* HttpRoutes::Find(const HttpRequest& request,
                                    std::string* allowed) const {
  allowed->clear();
  const auto path = by_path_.find(request.path);
  if (path == by_path_.end()) return nullptr;
  const auto method = path->second.find(request.method);
  if (method != path->second.end()) return &method->second;
  std::vector<std::string> methods;
  for (const auto& [m, h] : path->second) methods.push_back(m);
  *allowed = absl::StrJoin(methods, ", ");
  return nullptr;
}

namespace {

HttpResponse Text(int status, std::string body, std::string type) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  r.content_type = std::move(type);
  return r;
}

void AddProbes(HttpRoutes& routes,
               std::shared_ptr<prometheus::Registry> registry,
               std::function<bool()> ready) {
  routes.Add("GET", "/metrics", [registry](std::shared_ptr<HttpExchange> ex) {
    ex->Respond(
        Text(200, prometheus::TextSerializer().Serialize(registry->Collect()),
             "text/plain; version=0.0.4; charset=utf-8"));
  });
  routes.Add("GET", "/health", [](std::shared_ptr<HttpExchange> ex) {
    ex->Respond(Text(200, "ok\n", "text/plain"));
  });
  routes.Add("GET", "/ready", [ready](std::shared_ptr<HttpExchange> ex) {
    const bool ok = ready();
    ex->Respond(
        Text(ok ? 200 : 503, ok ? "ready\n" : "not ready\n", "text/plain"));
  });
}

absl::StatusOr<std::unique_ptr<net::ssl::context>> MakeSslContext(
    const TlsOptions& tls) {
  if (!tls.enabled()) return nullptr;
  auto ctx = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
  std::string error;
  if (!SetUpSslContext(tls, *ctx->native_handle(), &error)) {
    return absl::InvalidArgumentError(
        error.empty() ? "TLS: cannot set up the HTTPS listener" : error);
  }
  return ctx;
}

void Accept(const std::shared_ptr<HttpServer::Core>& core) {
  core->acceptor->async_accept(
      net::make_strand(*core->ioc),
      [core](boost::system::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !core->acceptor->is_open()) {
          return;
        }
        if (ec) {
          // EMFILE and the like: keep serving the open connections.
          spdlog::warn("HTTP accept: {}", ec.message());
        } else {
          StartSession(core, std::move(socket));
        }
        Accept(core);
      });
}

absl::Status Listen(HttpServer::Core& core, int* port) {
  const HttpServer::Options& o = core.options;
  boost::system::error_code ec;
  tcp::resolver resolver(*core.ioc);
  const auto found = resolver.resolve(o.host, std::to_string(o.port),
                                      tcp::resolver::passive, ec);
  if (ec || found.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host: cannot resolve '", o.host, "' (", ec.message(), ")"));
  }
  const tcp::endpoint endpoint = found.begin()->endpoint();
  // On its own strand: the accept loop and Stop()'s close never run at once.
  core.acceptor = std::make_unique<tcp::acceptor>(net::make_strand(*core.ioc));
  core.acceptor->open(endpoint.protocol(), ec);
  if (!ec) core.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) core.acceptor->bind(endpoint, ec);
  if (!ec) core.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("--http-port: cannot listen on ",
                                               o.host, ":", o.port, " (",
                                               ec.message(), ")"));
  }
  *port = core.acceptor->local_endpoint().port();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const Options& options, std::shared_ptr<prometheus::Registry> registry,
    std::function<bool()> ready,
    const std::function<void(HttpRoutes&)>& add_routes) {
  auto core = std::make_shared<Core>();
  core->options = options;
  core->hosts = HostPolicy(options.host, options.allowed_hosts);
  core->options.threads = std::max(1, options.threads);
  auto ssl = MakeSslContext(options.tls);
  if (!ssl.ok()) return ssl.status();
  core->ssl = *std::move(ssl);
  core->requests = &prometheus::BuildCounter()
                        .Name("kvserve_http_requests_total")
                        .Help(
                            "HTTP requests answered, by route and status "
                            "code")
                        .Register(*registry);
  AddProbes(core->routes, std::move(registry), std::move(ready));
  if (add_routes) add_routes(core->routes);
  core->ioc = std::make_unique<net::io_context>(core->options.threads);
  std::unique_ptr<HttpServer> http(new HttpServer());
  if (absl::Status s = Listen(*core, &http->port_); !s.ok()) return s;
  core->work.emplace(core->ioc->get_executor());
  Accept(core);
  for (int i = 0; i < core->options.threads; ++i) {
    core->threads.emplace_back([ioc = core->ioc.get()] { ioc->run(); });
  }
  http->core_ = std::move(core);
  return http;
}

void HttpServer::Stop(absl::Duration grace) {
  if (core_ == nullptr) return;
  std::vector<std::weak_ptr<SessionBase>> sessions;
  {
    absl::MutexLock lock(&core_->mu);
    if (core_->stopped) return;
    sessions = core_->sessions;
  }
  net::post(core_->acceptor->get_executor(), [core = core_] {
    boost::system::error_code ec;
    core->acceptor->close(ec);
  });
  if (grace > absl::ZeroDuration()) {
    // Writes still flow (Post works until `stopped`): a stream whose last
    // tokens the engine produced just before the drain ended gets them out.
    for (const std::weak_ptr<SessionBase>& weak : sessions) {
      if (std::shared_ptr<SessionBase> s = weak.lock()) {
        net::post(s->executor(), [s] { s->Shutdown(); });
      }
    }
    const absl::Time deadline = absl::Now() + grace;
    while (core_->connections.load() > 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  {
    absl::MutexLock lock(&core_->mu);
    core_->stopped = true;
    sessions.clear();
    sessions.swap(core_->sessions);
  }
  for (const std::weak_ptr<SessionBase>& weak : sessions) {
    if (std::shared_ptr<SessionBase> s = weak.lock()) {
      net::post(s->executor(), [s] { s->Close(); });
    }
  }
  core_->work.reset();
  for (std::thread& t : core_->threads) t.join();
  core_->threads.clear();
  core_->acceptor.reset();
  // Destroys what is still queued (and the sessions it holds).
  core_->ioc.reset();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace kvserve::server
