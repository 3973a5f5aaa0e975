// One HTTP/1.1 connection of the daemon's HTTP server (plain or TLS): reads
// requests, applies the checks that come before the body (auth, size,
// connection cap), dispatches to a route, and writes whole or streamed
// responses. See http_server.h for the behaviour and http_internal.h for
// the lifetime rules.
//
// Phases of a connection (all on its strand):
//   [handshake] -> header -> checks -> [100 Continue] -> body -> exchange
//   exchange: the handler answers through an Exchange; meanwhile one read
//     is kept pending ("watch") so a client that goes away is noticed at
//     once, not at the next write. Bytes it receives (a pipelined request)
//     are kept for the next request.
//   after the response: keep-alive -> wait for the next header (5 s);
//     otherwise shut down sending and read until the client closes (2 s),
//     so the response is not lost to a reset.
// One timer serves every phase: reads, idle wait, and each write.
#include <array>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/stream_traits.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <deque>
#include <limits>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "server/http_internal.h"
#include "server/openai_json.h"

namespace kvserve::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

constexpr auto kReadTimeout = std::chrono::seconds(30);
constexpr auto kIdleTimeout = std::chrono::seconds(5);
constexpr auto kWriteTimeout = std::chrono::seconds(60);
constexpr auto kLingerTimeout = std::chrono::seconds(2);
constexpr uint64_t kDefaultBodyLimit = uint64_t{64} << 20;
constexpr uint32_t kHeaderLimit = 16 * 1024;
constexpr size_t kWatchBytes = 4096;

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

std::string ErrorBody(const std::string& message, const char* type,
                      const char* code) {
  const nlohmann::json j = {{"error",
                             {{"message", message},
                              {"type", type},
                              {"param", nullptr},
                              {"code", code}}}};
  return j.dump();
}

// A parse error of the request itself, as opposed to the peer going away
// (end of stream, a partial message, a socket error) or a limit answered
// on its own (header_limit, body_limit).
bool IsMalformed(beast::error_code ec) {
  if (!ec || ec.category() !=
                 http::make_error_code(http::error::bad_method).category()) {
    return false;
  }
  switch (static_cast<http::error>(ec.value())) {
    case http::error::end_of_stream:
    case http::error::partial_message:
    case http::error::need_more:
    case http::error::need_buffer:
    case http::error::buffer_overflow:
    case http::error::header_limit:
    case http::error::body_limit:
    case http::error::stale_parser:
    case http::error::short_read:
      return false;
    default:
      return true;
  }
}

HttpResponse JsonError(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

// "HTTP/1.1 200 OK" and the headers every response carries.
std::string Head(const HttpResponse& r, unsigned version, bool keep_alive,
                 const std::string& length_header) {
  const auto status = http::int_to_status(static_cast<unsigned>(r.status));
  std::string out = absl::StrCat(
      "HTTP/", version / 10, ".", version % 10, " ", r.status, " ",
      absl::string_view(http::obsolete_reason(status).data(),
                        http::obsolete_reason(status).size()),
      "\r\nServer: kvserve\r\nContent-Type: ", r.content_type, "\r\n");
  for (const auto& [name, value] : r.headers) {
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  }
  if (!length_header.empty()) absl::StrAppend(&out, length_header, "\r\n");
  absl::StrAppend(&out, "Connection: ", keep_alive ? "keep-alive" : "close",
                  "\r\n\r\n");
  return out;
}

class Exchange final : public HttpExchange {
 public:
  Exchange(std::shared_ptr<HttpServer::Core> core,
           std::weak_ptr<SessionBase> session, uint64_t seq,
           HttpRequest request)
      : core_(std::move(core)),
        session_(std::move(session)),
        seq_(seq),
        request_(std::move(request)) {}

  const HttpRequest& request() const override { return request_; }
  void Respond(HttpResponse r) override {
    core_->Post(session_,
                [seq = seq_, r = std::move(r)](SessionBase& s) mutable {
                  s.Respond(seq, std::move(r));
                });
  }
  void StartStream(HttpResponse head) override {
    core_->Post(session_,
                [seq = seq_, h = std::move(head)](SessionBase& s) mutable {
                  s.StartStream(seq, std::move(h));
                });
  }
  void Write(std::string data, std::function<void(bool)> sent) override {
    core_->Post(session_, [seq = seq_, d = std::move(data),
                           sent = std::move(sent)](SessionBase& s) mutable {
      s.Write(seq, std::move(d), std::move(sent));
    });
  }
  void EndStream() override {
    core_->Post(session_, [seq = seq_](SessionBase& s) { s.EndStream(seq); });
  }
  void OnClose(std::function<void()> closed) override {
    core_->Post(session_,
                [seq = seq_, f = std::move(closed)](SessionBase& s) mutable {
                  s.OnClose(seq, std::move(f));
                });
  }
  void Run(std::function<void()> f) override {
    core_->Post(session_, [f = std::move(f)](SessionBase&) { f(); });
  }

 private:
  const std::shared_ptr<HttpServer::Core> core_;
  const std::weak_ptr<SessionBase> session_;
  const uint64_t seq_;
  const HttpRequest request_;
};

template <typename Stream>
class Session final : public SessionBase {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  Session(std::shared_ptr<HttpServer::Core> core, Stream stream, bool over_cap)
      : core_(std::move(core)),
        stream_(std::move(stream)),
        timer_(stream_.get_executor()),
        over_cap_(over_cap) {
    core_->connections.fetch_add(1);
  }
  ~Session() override { core_->connections.fetch_sub(1); }

  void Begin() {
    if constexpr (kTls) {
      Arm(kReadTimeout);
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = Self()](beast::error_code ec) {
                                self->Disarm();
                                if (ec) return self->CloseNow();
                                self->ReadHeader();
                              });
    } else {
      ReadHeader();
    }
  }

  net::any_io_executor executor() override { return stream_.get_executor(); }
  void Respond(uint64_t seq, HttpResponse r) override;
  void StartStream(uint64_t seq, HttpResponse head) override;
  void Write(uint64_t seq, std::string data,
             std::function<void(bool)> sent) override;
  void EndStream(uint64_t seq) override;
  void OnClose(uint64_t seq, std::function<void()> closed) override;
  void Close() override {
    FireClose();
    CloseNow();
  }
  void Shutdown() override {
    if (closed_) return;
    keep_alive_ = false;  // EndExchange lingers, then closes
    if (!in_exchange_) CloseNow();
  }

 private:
  struct Pending {
    std::string data;
    std::function<void(bool)> sent;  // may be empty
    bool last = false;               // ends the exchange
  };

  std::shared_ptr<Session> Self() {
    return std::static_pointer_cast<Session>(shared_from_this());
  }
  bool Current(uint64_t seq) const {
    return in_exchange_ && seq == seq_ && !closed_;
  }

  void ReadHeader();
  void OnHeader(beast::error_code ec);
  void RefuseMalformed(beast::error_code ec);
  [[nodiscard]] bool Admit();
  void ReadBody();
  void Dispatch();
  void Refuse(HttpResponse r);
  void StartWatch();
  void OnWatch(beast::error_code ec, size_t n);
  void Send(std::string data, std::function<void(bool)> sent, bool last);
  void WriteNext();
  void OnWritten(beast::error_code ec);
  void EndExchange();
  void Linger();
  void Drain();
  void FireClose() {
    if (!in_exchange_ || !on_close_) return;
    std::function<void()> f = std::move(on_close_);
    on_close_ = nullptr;
    f();
  }
  void Fail() {
    if (closed_) return;
    FireClose();
    CloseNow();
  }
  void CloseNow();
  void Arm(std::chrono::seconds d) {
    timer_.expires_after(d);
    timer_.async_wait(
        [self = Self(), gen = ++timer_gen_](beast::error_code ec) {
          if (ec || gen != self->timer_gen_) return;
          if (self->in_exchange_) return self->Fail();  // a write stalled
          self->CloseNow();
        });
  }
  void Disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  const std::shared_ptr<HttpServer::Core> core_;
  Stream stream_;
  net::steady_timer timer_;
  uint64_t timer_gen_ = 0;
  const bool over_cap_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string route_;  // the current request's path, for the metrics
  HttpRequest request_;
  uint64_t seq_ = 0;
  unsigned version_ = 11;
  bool first_ = true;
  bool in_exchange_ = false;
  bool streaming_ = false;
  bool keep_alive_ = false;
  bool watching_ = false;
  bool writing_ = false;
  bool lingering_ = false;
  bool closed_ = false;
  std::deque<Pending> queue_;
  std::function<void()> on_close_;
  std::shared_ptr<SessionBase> hold_;  // self, while an exchange is open
  std::array<char, 4096> drain_buf_;
};

template <typename Stream>
void Session<Stream>::ReadHeader() {
  parser_.emplace();
  route_.clear();
  parser_->header_limit(kHeaderLimit);
  // No limit while the header is read (Beast would fail a Content-Length
  // over it before the header is complete); Admit() checks the declared
  // length and sets the limit for the body. NOTE: not boost::none: Beast
  // 1.74 compares `length > optional` and none compares below every length.
  parser_->body_limit(std::numeric_limits<uint64_t>::max());
  Arm(first_ || buf_.size() > 0 ? kReadTimeout : kIdleTimeout);
  first_ = false;
  http::async_read_header(
      stream_, buf_, *parser_,
      [self = Self()](beast::error_code ec, size_t) { self->OnHeader(ec); });
}

template <typename Stream>
void Session<Stream>::OnHeader(beast::error_code ec) {
  Disarm();
  if (ec == http::error::header_limit) {
    return Refuse(JsonError(
        431, ErrorBody(absl::StrCat("request headers: over the limit of ",
                                    kHeaderLimit, " bytes"),
                       "invalid_request_error", "headers_too_large")));
  }
  if (IsMalformed(ec)) return RefuseMalformed(ec);
  if (ec) return CloseNow();
  const auto& h = parser_->get();
  request_ = HttpRequest();
  request_.method = std::string(h.method_string());
  const std::string target(h.target());
  request_.path = target.substr(0, target.find('?'));
  route_ = request_.path;
  for (const auto& field : h) {
    request_.headers.emplace_back(
        absl::AsciiStrToLower(std::string(field.name_string())),
        std::string(field.value()));
  }
  if (!Admit()) return;
  const std::string* expect = request_.Header("expect");
  if (expect != nullptr && absl::EqualsIgnoreCase(*expect, "100-continue") &&
      !parser_->is_done()) {
    // curl sends this for bodies over 1 KiB and waits up to 1 s for it.
    Arm(kWriteTimeout);
    static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    net::async_write(stream_, net::buffer(kContinue, sizeof(kContinue) - 1),
                     [self = Self()](beast::error_code ec2, size_t) {
                       self->Disarm();
                       if (ec2) return self->CloseNow();
                       self->ReadBody();
                     });
    return;
  }
  ReadBody();
}

// The checks before the body: connection cap, token, declared size. False
// when the request was answered (and the connection will close).
template <typename Stream>
bool Session<Stream>::Admit() {
  const HttpServer::Options& o = core_->options;
  const std::string& path = request_.path;
  const bool probe = path == "/health" || path == "/ready";
  if (over_cap_ && !probe && path != "/metrics") {
    HttpResponse r = JsonError(
        429, ErrorBody(absl::StrFormat(
                           "HTTP server busy: %d connections open, the most "
                           "--http-max-connections allows",
                           o.max_connections),
                       "rate_limit_error", "too_many_connections"));
    r.headers.emplace_back("Retry-After", "1");
    Refuse(std::move(r));
    return false;
  }
  if (std::optional<HeadRefusal> no =
          CheckRequestHead(request_, parser_->get().version(), core_->hosts)) {
    Refuse(JsonError(
        no->status, ErrorBody(no->message, "invalid_request_error", no->code)));
    return false;
  }
  // /ui is a static page: the data it draws needs the token.
  const bool open =
      probe || path == "/ui" || (path == "/metrics" && !o.auth_metrics);
  if (o.auth != nullptr && !open) {
    const std::string* value = request_.Header("authorization");
    absl::StatusOr<TenantRef> tenant =
        o.auth->Authenticate(value != nullptr ? *value : "", value != nullptr);
    if (!tenant.ok()) {
      HttpResponse r = JsonError(401, ToHttpError(tenant.status()).body);
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      Refuse(std::move(r));
      return false;
    }
    request_.tenant = *std::move(tenant);
  } else if (o.auth == nullptr) {
    request_.tenant = o.single_tenant;
  }
  const boost::optional<uint64_t> declared = parser_->content_length();
  const std::optional<uint64_t> length =
      declared ? std::optional<uint64_t>(*declared) : std::nullopt;
  const uint64_t limit = o.max_request_bytes > 0
                             ? static_cast<uint64_t>(o.max_request_bytes)
                             : kDefaultBodyLimit;
  if (std::optional<HeadRefusal> no = CheckDeclaredLength(length, limit)) {
    Refuse(JsonError(
        no->status, ErrorBody(no->message, "invalid_request_error", no->code)));
    return false;
  }
  parser_->body_limit(limit);  // bounds chunked bodies too
  return true;
}

template <typename Stream>
void Session<Stream>::ReadBody() {
  if (parser_->is_done()) return Dispatch();
  Arm(kReadTimeout);
  http::async_read(
      stream_, buf_, *parser_, [self = Self()](beast::error_code ec, size_t) {
        self->Disarm();
        if (ec == http::error::body_limit) {
          const int64_t l = self->core_->options.max_request_bytes;
          return self->Refuse(JsonError(
              413, ErrorBody(TooLargeMessage(l > 0 ? static_cast<uint64_t>(l)
                                                   : kDefaultBodyLimit,
                                             std::nullopt),
                             "invalid_request_error", "request_too_large")));
        }
        if (IsMalformed(ec)) return self->RefuseMalformed(ec);
        if (ec) return self->CloseNow();
        self->Dispatch();
      });
}

template <typename Stream>
void Session<Stream>::Dispatch() {
  http::request<http::string_body> req = parser_->release();
  parser_.reset();
  request_.body = std::move(req.body());
  keep_alive_ = req.keep_alive();
  version_ = req.version();
  in_exchange_ = true;
  hold_ = shared_from_this();
  auto exchange = std::make_shared<Exchange>(core_, weak_from_this(), seq_,
                                             std::move(request_));
  StartWatch();
  std::string allowed;
  const HttpHandler* handler =
      core_->routes.Find(exchange->request(), &allowed);
  if (handler != nullptr) return (*handler)(std::move(exchange));
  if (!allowed.empty()) {
    HttpResponse r = JsonError(
        405,
        ErrorBody(absl::StrCat("method ", exchange->request().method,
                               " is not allowed on ", exchange->request().path,
                               " (allowed: ", allowed, ")"),
                  "invalid_request_error", "method_not_allowed"));
    r.headers.emplace_back("Allow", allowed);
    return Respond(seq_, std::move(r));
  }
  if (core_->routes.fallback()) return core_->routes.fallback()(exchange);
  HttpResponse r;
  r.status = 404;
  r.content_type = "text/plain";
  r.body = "not found\n";
  Respond(seq_, std::move(r));
}

// A request the parser refused (RFC 9112 6.3: a bad or conflicting
// Content-Length, Content-Length with Transfer-Encoding, a bad request line
// or chunk) gets a 400 before the connection closes.
template <typename Stream>
void Session<Stream>::RefuseMalformed(beast::error_code ec) {
  Refuse(JsonError(
      400, ErrorBody(absl::StrCat("malformed HTTP request: ", ec.message()),
                     "invalid_request_error", "bad_request")));
}

// Answers before the body was read (or while it was too long): the
// connection closes after the answer.
template <typename Stream>
void Session<Stream>::Refuse(HttpResponse r) {
  parser_.reset();
  version_ = 11;
  keep_alive_ = false;
  in_exchange_ = true;
  hold_ = shared_from_this();
  Respond(seq_, std::move(r));
}

template <typename Stream>
void Session<Stream>::StartWatch() {
  if (watching_ || closed_ || buf_.size() > 0) return;
  watching_ = true;
  stream_.async_read_some(buf_.prepare(kWatchBytes),
                          [self = Self()](beast::error_code ec, size_t n) {
                            self->OnWatch(ec, n);
                          });
}

template <typename Stream>
void Session<Stream>::OnWatch(beast::error_code ec, size_t n) {
  watching_ = false;
  if (closed_) return;
  if (lingering_) {
    if (ec) return CloseNow();
    buf_.consume(buf_.size());
    return Drain();
  }
  if (ec) return Fail();  // the client went away
  buf_.commit(n);
  if (in_exchange_) return;  // a pipelined request: read after this one
  Disarm();
  ReadHeader();
}

template <typename Stream>
void Session<Stream>::Respond(uint64_t seq, HttpResponse r) {
  if (!Current(seq) || streaming_) return;
  core_->CountResponse(route_, r.status);
  std::string data = Head(r, version_, keep_alive_,
                          absl::StrCat("Content-Length: ", r.body.size()));
  absl::StrAppend(&data, r.body);
  Send(std::move(data), nullptr, true);
}

template <typename Stream>
void Session<Stream>::StartStream(uint64_t seq, HttpResponse head) {
  if (!Current(seq) || streaming_) return;
  core_->CountResponse(route_, head.status);
  streaming_ = true;
  if (version_ < 11) keep_alive_ = false;  // no chunking: the close ends it
  Send(Head(head, version_, keep_alive_,
            version_ >= 11 ? "Transfer-Encoding: chunked" : ""),
       nullptr, false);
}

template <typename Stream>
void Session<Stream>::Write(uint64_t seq, std::string data,
                            std::function<void(bool)> sent) {
  if (!Current(seq) || !streaming_) {
    if (sent) sent(false);
    return;
  }
  if (data.empty()) {  // an empty chunk would end the response
    if (sent) sent(true);
    return;
  }
  if (version_ >= 11) {
    data = absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
  }
  Send(std::move(data), std::move(sent), false);
}

template <typename Stream>
void Session<Stream>::EndStream(uint64_t seq) {
  if (!Current(seq) || !streaming_) return;
  Send(version_ >= 11 ? "0\r\n\r\n" : "", nullptr, true);
}

template <typename Stream>
void Session<Stream>::OnClose(uint64_t seq, std::function<void()> closed) {
  if (Current(seq)) {
    on_close_ = std::move(closed);
  } else if (closed_) {
    closed();
  }
}

template <typename Stream>
void Session<Stream>::Send(std::string data, std::function<void(bool)> sent,
                           bool last) {
  queue_.push_back(Pending{std::move(data), std::move(sent), last});
  if (!writing_) WriteNext();
}

template <typename Stream>
void Session<Stream>::WriteNext() {
  writing_ = true;
  Arm(kWriteTimeout);
  net::async_write(
      stream_, net::buffer(queue_.front().data),
      [self = Self()](beast::error_code ec, size_t) { self->OnWritten(ec); });
}

template <typename Stream>
void Session<Stream>::OnWritten(beast::error_code ec) {
  writing_ = false;
  if (queue_.empty()) return;  // closed meanwhile
  Disarm();
  Pending p = std::move(queue_.front());
  queue_.pop_front();
  if (p.sent) p.sent(!ec);
  if (ec) return Fail();
  if (p.last) return EndExchange();
  if (!queue_.empty()) WriteNext();
}

template <typename Stream>
void Session<Stream>::EndExchange() {
  in_exchange_ = false;
  streaming_ = false;
  on_close_ = nullptr;
  ++seq_;
  hold_.reset();  // the caller's completion handler still holds this
  if (!keep_alive_) return Linger();
  if (watching_) return Arm(kIdleTimeout);  // OnWatch goes on
  ReadHeader();
}

// Ends a connection whose response is written: shut down sending, then
// read (and drop) whatever the client still sends until it closes, so its
// unread request bytes do not turn the close into a reset that could
// destroy the response in flight.
template <typename Stream>
void Session<Stream>::Linger() {
  lingering_ = true;
  beast::error_code ec;
  tcp::socket& socket = beast::get_lowest_layer(stream_).socket();
  socket.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return CloseNow();
  Arm(kLingerTimeout);
  buf_.consume(buf_.size());
  if (watching_) return;  // the pending read drains (OnWatch)
  // Below TLS: bytes are dropped unread, and TLS must not try to answer
  // them (it can no longer send).
  Drain();
}

template <typename Stream>
void Session<Stream>::Drain() {
  beast::get_lowest_layer(stream_).socket().async_read_some(
      net::buffer(drain_buf_), [self = Self()](beast::error_code ec, size_t) {
        if (ec || self->closed_) return self->CloseNow();
        self->Drain();
      });
}

template <typename Stream>
void Session<Stream>::CloseNow() {
  if (closed_) return;
  closed_ = true;
  Disarm();
  beast::error_code ec;
  beast::get_lowest_layer(stream_).socket().close(ec);
  std::deque<Pending> dropped = std::move(queue_);
  queue_.clear();
  for (Pending& p : dropped) {
    if (p.sent) p.sent(false);
  }
  on_close_ = nullptr;
  hold_.reset();
}

}  // namespace

void StartSession(const std::shared_ptr<HttpServer::Core>& core,
                  tcp::socket socket) {
  const bool over_cap =
      core->connections.load() >= core->options.max_connections;
  beast::tcp_stream tcp(std::move(socket));
  // Registered under the lock that Stop() takes, so Stop() closes every
  // session it did not prevent. Begin() only starts I/O (no handler runs
  // inside it).
  absl::MutexLock lock(&core->mu);
  if (core->stopped) return;
  if (core->sessions.size() >= 256 &&
      (core->sessions.size() & (core->sessions.size() - 1)) == 0) {
    std::erase_if(core->sessions, [](const std::weak_ptr<SessionBase>& w) {
      return w.expired();
    });
  }
  if (core->ssl != nullptr) {
    auto s = std::make_shared<Session<TlsStream>>(
        core, TlsStream(std::move(tcp), *core->ssl), over_cap);
    core->sessions.push_back(s);
    s->Begin();
  } else {
    auto s =
        std::make_shared<Session<PlainStream>>(core, std::move(tcp), over_cap);
    core->sessions.push_back(s);
    s->Begin();
  }
}

}  // namespace kvserve::server
