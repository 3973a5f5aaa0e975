// Boost.Beast SSE prototype: the same endpoint and events as httplib_sse.cc,
// served asynchronously (one io_context run by --threads threads; a stream
// holds a socket and a timer, no thread).
// clang-format off
#include <utility>  // first: Boost 1.74 asio/awaitable.hpp uses std::exchange
// clang-format on

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "sse_common.h"

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket s, const http_proto::Config& cfg)
      : socket_(std::move(s)), cfg_(cfg), timer_(socket_.get_executor()) {}

  void Start() {
    http::async_read(socket_, buf_, req_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->Close();
                       self->OnRequest();
                     });
  }

 private:
  void OnRequest() {
    if (req_.method() != http::verb::post ||
        req_.target() != "/v1/completions") {
      auto res = std::make_shared<http::response<http::string_body>>(
          http::status::not_found, req_.version());
      res->body() = "not found\n";
      res->prepare_payload();
      http::async_write(socket_, *res,
                        [self = shared_from_this(), res](
                            beast::error_code, size_t) { self->Close(); });
      return;
    }
    res_.result(http::status::ok);
    res_.version(req_.version());
    res_.set(http::field::content_type, "text/event-stream");
    res_.set(http::field::cache_control, "no-cache");
    res_.chunked(true);
    sr_ = std::make_unique<http::response_serializer<http::empty_body>>(res_);
    http::async_write_header(
        socket_, *sr_,
        [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->Close();
          self->Next();
        });
  }

  void Next() {
    if (sent_ == cfg_.chunks) {
      event_ = http_proto::kDone;
      net::async_write(
          socket_, http::make_chunk(net::buffer(event_)),
          [self = shared_from_this()](beast::error_code ec, size_t) {
            if (ec) return self->Close();
            net::async_write(
                self->socket_, http::make_chunk_last(),
                [self](beast::error_code, size_t) { self->Close(); });
          });
      return;
    }
    timer_.expires_after(std::chrono::milliseconds(cfg_.delay_ms));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->Close();
      self->event_ = http_proto::Event(self->sent_++);
      net::async_write(self->socket_,
                       http::make_chunk(net::buffer(self->event_)),
                       [self](beast::error_code ec2, size_t) {
                         if (ec2) return self->Close();
                         self->Next();
                       });
    });
  }

  void Close() {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    socket_.close(ec);
  }

  tcp::socket socket_;
  const http_proto::Config& cfg_;
  net::steady_timer timer_;
  beast::flat_buffer buf_;
  http::request<http::string_body> req_;
  http::response<http::empty_body> res_;
  std::unique_ptr<http::response_serializer<http::empty_body>> sr_;
  std::string event_;
  int sent_ = 0;
};

void Accept(tcp::acceptor& acc, const http_proto::Config& cfg) {
  acc.async_accept([&acc, &cfg](beast::error_code ec, tcp::socket s) {
    if (!ec) std::make_shared<Session>(std::move(s), cfg)->Start();
    Accept(acc, cfg);
  });
}

int main(int argc, char** argv) {
  const http_proto::Config cfg = http_proto::ParseFlags(argc, argv);
  net::io_context ioc(cfg.threads);
  tcp::acceptor acc(ioc);
  const tcp::endpoint ep(net::ip::make_address("127.0.0.1"),
                         static_cast<unsigned short>(cfg.port));
  acc.open(ep.protocol());
  acc.set_option(net::socket_base::reuse_address(true));
  acc.bind(ep);
  acc.listen(net::socket_base::max_listen_connections);
  std::printf("listening 127.0.0.1:%d\n", acc.local_endpoint().port());
  std::fflush(stdout);
  Accept(acc, cfg);
  std::vector<std::thread> runners;
  for (int i = 1; i < cfg.threads; ++i)
    runners.emplace_back([&] { ioc.run(); });
  ioc.run();
  for (auto& t : runners) t.join();
  return 0;
}
