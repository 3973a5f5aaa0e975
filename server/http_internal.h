// Internals shared by http_server.cc (listener, routes, start/stop) and
// http_session.cc (one connection). Not part of the server's interface:
// only those two files include it (it pulls in Boost.Asio and Beast).
//
// Lifetime: HttpServer::Core is shared by the server, every connection and
// every exchange (the engine's stream sinks hold exchanges, possibly past
// Stop). Connections are owned by their pending I/O and, while an exchange
// is open, by themselves; exchanges hold them weakly. Stop() sets `stopped`
// under `mu` before it closes connections and destroys the io_context, and
// every post from outside the I/O threads checks it under the same lock, so
// nothing is queued on a destroyed io_context.
#pragma once

// clang-format off
#include <utility>  // first: Boost 1.74's asio headers use std::exchange
// clang-format on

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "server/http_checks.h"
#include "server/http_server.h"

namespace kvserve::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// One connection, as exchanges see it. Every method runs on the
// connection's strand; `seq` names the exchange (requests on a keep-alive
// connection are numbered), and calls for an exchange that is over are
// ignored (a Write's `sent` gets false).
class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  virtual ~SessionBase() = default;
  virtual net::any_io_executor executor() = 0;
  virtual void Respond(uint64_t seq, HttpResponse response) = 0;
  virtual void StartStream(uint64_t seq, HttpResponse head) = 0;
  virtual void Write(uint64_t seq, std::string data,
                     std::function<void(bool)> sent) = 0;
  virtual void EndStream(uint64_t seq) = 0;
  virtual void OnClose(uint64_t seq, std::function<void()> closed) = 0;
  // Closes the connection now (server stop); an open exchange's OnClose
  // callback runs.
  virtual void Close() = 0;
  // Graceful stop: ends the connection after the response in progress is
  // written (now, when there is none).
  virtual void Shutdown() = 0;
};

struct HttpServer::Core {
  HttpServer::Options options;
  HostPolicy hosts;  // from options.host and options.allowed_hosts
  HttpRoutes routes;
  // kvserve_http_requests_total{route, code}; route is a routed path or
  // "other" (so unknown paths cannot grow the label set).
  prometheus::Family<prometheus::Counter>* requests = nullptr;

  // Counts one answer to a request for `path` (any thread).
  void CountResponse(const std::string& path, int status) const {
    if (requests == nullptr) return;
    requests
        ->Add({{"route", routes.HasPath(path) ? path : "other"},
               {"code", std::to_string(status)}})
        .Increment();
  }
  std::unique_ptr<net::io_context> ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::unique_ptr<net::ssl::context> ssl;  // null: plain HTTP
  std::unique_ptr<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<int> connections{0};  // open sessions

  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  std::vector<std::weak_ptr<SessionBase>> sessions ABSL_GUARDED_BY(mu);

  // Queues `f(session)` on the session's strand unless the server stopped
  // or the session is gone. Any thread.
  template <typename F>
  void Post(const std::weak_ptr<SessionBase>& weak, F f) {
    absl::ReaderMutexLock lock(&mu);
    if (stopped) return;
    std::shared_ptr<SessionBase> s = weak.lock();
    if (s == nullptr) return;
    net::any_io_executor ex = s->executor();
    net::post(ex, [s = std::move(s), f = std::move(f)]() mutable { f(*s); });
  }
};

// Serves an accepted connection until it closes (http_session.cc). I/O
// thread.
void StartSession(const std::shared_ptr<HttpServer::Core>& core,
                  tcp::socket socket);

}  // namespace kvserve::server
