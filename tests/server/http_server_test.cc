// HttpServer (Boost.Beast) through real sockets: routing (404/405), the
// checks before the body (auth, size, connection cap), keep-alive and
// pipelining, 100-continue, streamed responses with their `sent`
// callbacks, disconnect detection, Stop() while a handler still holds its
// exchange, and a graceful Stop that lets a stream finish.
#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// A blocking TCP client with deadlines.
class Conn {
 public:
  explicit Conn(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Conn() { Close(); }
  bool ok() const { return ok_; }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }
  bool Send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until `want` is in what was read (or EOF / 10 s); returns all.
  std::string ReadUntil(const std::string& want) {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (!absl::StrContains(got_, want) && absl::Now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) break;
      got_.append(buf, static_cast<size_t>(n));
    }
    return got_;
  }
  // True if the server closed the connection within 10 s.
  bool ReadEof() {
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (absl::Now() < end) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
      got_.append(buf, static_cast<size_t>(n));
    }
    return false;
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
  std::string got_;
};

std::string Get(const std::string& path) {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\n\r\n");
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServer::Options o = {}) {
    o.port = 0;
    auto s = HttpServer::Start(
        o, std::make_shared<prometheus::Registry>(), [] { return true; },
        [this](HttpRoutes& routes) { AddRoutes(routes); });
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  void AddRoutes(HttpRoutes& routes) {
    routes.Add("POST", "/echo", [](std::shared_ptr<HttpExchange> ex) {
      HttpResponse r;
      r.content_type = "text/plain";
      r.body = absl::StrCat("echo:", ex->request().body);
      ex->Respond(std::move(r));
    });
    // Streams three pieces, each after the previous one was written.
    routes.Add("GET", "/stream", [this](std::shared_ptr<HttpExchange> ex) {
      stream_started_.fetch_add(1);
      ex->StartStream(HttpResponse{200, "text/event-stream", "", {}});
      WriteNext(ex, 0);
    });
    // Starts a stream and holds the exchange until the client goes away.
    routes.Add("GET", "/hold", [this](std::shared_ptr<HttpExchange> ex) {
      ex->OnClose([this] { closed_.Notify(); });
      ex->StartStream(HttpResponse{200, "text/plain", "", {}});
      ex->Write("held\n", [](bool) {});
      absl::MutexLock lock(&mu_);
      held_ = ex;
    });
  }

  void WriteNext(std::shared_ptr<HttpExchange> ex, int i) {
    if (i == 3) return ex->EndStream();
    ex->Write(absl::StrCat("piece ", i, "\n"), [this, ex, i](bool ok) {
      if (!ok) return;
      sent_.fetch_add(1);
      WriteNext(ex, i + 1);
    });
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> sent_{0};
  std::atomic<int> stream_started_{0};
  absl::Notification closed_;
  absl::Mutex mu_;
  std::shared_ptr<HttpExchange> held_ ABSL_GUARDED_BY(mu_);
};

TEST_F(HttpServerTest, ProbesRoutesAndMethodErrors) {
  Start();
  Conn c(server_->port());
  ASSERT_TRUE(c.ok());
  // Three requests on one keep-alive connection, pipelined in one send.
  ASSERT_TRUE(c.Send(Get("/health") + Get("/nothing") +
                     "POST /health HTTP/1.1\r\nHost: localhost\r\n"
                     "Content-Length: 0\r\n\r\n"));
  const std::string got = c.ReadUntil("allowed: GET");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK"));
  EXPECT_THAT(got, HasSubstr("\r\n\r\nok\n"));
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 404 Not Found"));
  EXPECT_THAT(got, HasSubstr("HTTP/1.1 405 Method Not Allowed"));
  EXPECT_THAT(got, HasSubstr("Allow: GET"));
  // In order: 200 before 404 before 405.
  EXPECT_LT(got.find(" 200 "), got.find(" 404 "));
  EXPECT_LT(got.find(" 404 "), got.find(" 405 "));
}

TEST_F(HttpServerTest, BodyChunkedBodyAndContinue) {
  Start();
  Conn c(server_->port());
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n"
             "Expect: 100-continue\r\n\r\n"));
  EXPECT_THAT(c.ReadUntil("100 Continue\r\n\r\n"),
              StartsWith("HTTP/1.1 100 Continue"));
  ASSERT_TRUE(c.Send("hello"));
  EXPECT_THAT(c.ReadUntil("echo:hello"), HasSubstr("echo:hello"));
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: "
             "chunked\r\n\r\n"
             "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  EXPECT_THAT(c.ReadUntil("echo:abcde"), HasSubstr("echo:abcde"));
}

// Framing the parser refuses gets a 400 before the connection closes
// (RFC 9112 6.3), never a silent close.
TEST_F(HttpServerTest, MalformedFramingAnswers400) {
  Start();
  const std::string cases[] = {
      "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n"
      "Content-Length: 4\r\n\r\nabcd",
      "POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n"
      "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
      "this is not http\r\n\r\n",
      "POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
      "\r\nzz\r\nabc\r\n0\r\n\r\n",
  };
  for (const std::string& request : cases) {
    SCOPED_TRACE(request);
    Conn c(server_->port());
    ASSERT_TRUE(c.Send(request));
    const std::string got = c.ReadUntil("}}");
    EXPECT_THAT(got, StartsWith("HTTP/1.1 400"));
    EXPECT_THAT(got, HasSubstr("malformed HTTP request"));
    EXPECT_THAT(got, HasSubstr("Connection: close"));
    EXPECT_TRUE(c.ReadEof());
  }
  // The server serves on.
  Conn c(server_->port());
  ASSERT_TRUE(c.Send(Get("/health")));
  EXPECT_THAT(c.ReadUntil("ok\n"), StartsWith("HTTP/1.1 200"));
}

// A transfer coding the server does not implement is 501 and the
// connection closes: the bytes after the head never run as a request (a
// smuggling primitive behind a lenient proxy). No Host, or a Host that
// names another server (DNS rebinding), is refused before any route runs.
TEST_F(HttpServerTest, UnknownCodingsHostsAndMissingHostAreRefused) {
  Start();
  struct Case {
    std::string request;
    const char* status;
  };
  const Case cases[] = {
      {"POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: gzip\r\n"
       "\r\nGET /stream HTTP/1.1\r\nHost: localhost\r\n\r\n",
       "HTTP/1.1 501"},
      {"POST /echo HTTP/1.1\r\nHost: localhost\r\n"
       "Transfer-Encoding: identity\r\n\r\nGET /stream HTTP/1.1\r\n"
       "Host: localhost\r\n\r\n",
       "HTTP/1.1 501"},
      {"GET /stream HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
      {"GET /stream HTTP/1.1\r\nHost: rebound.example\r\n\r\n", "HTTP/1.1 403"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.request);
    Conn c(server_->port());
    ASSERT_TRUE(c.Send(k.request));
    const std::string got = c.ReadUntil("}}");
    EXPECT_THAT(got, StartsWith(k.status));
    EXPECT_THAT(got, HasSubstr("Connection: close"));
    EXPECT_TRUE(c.ReadEof());
    EXPECT_EQ(stream_started_.load(), 0) << "the smuggled request ran";
  }
}

// Every answer is counted by route and status code; unknown paths share
// the "other" route.
TEST_F(HttpServerTest, CountsRequestsByRouteAndCode) {
  Start();
  Conn c(server_->port());
  ASSERT_TRUE(c.Send(Get("/health") + Get("/nothing") + Get("/elsewhere") +
                     Get("/stream")));
  c.ReadUntil("piece 2\n");
  Conn m(server_->port());
  ASSERT_TRUE(m.Send(Get("/metrics")));
  const std::string got = m.ReadUntil(R"(route="/stream"})");
  EXPECT_THAT(got, HasSubstr(R"(kvserve_http_requests_total{code="200",)"
                             R"(route="/health"} 1)"));
  EXPECT_THAT(got, HasSubstr(R"(kvserve_http_requests_total{code="404",)"
                             R"(route="other"} 2)"));
  EXPECT_THAT(got, HasSubstr(R"(kvserve_http_requests_total{code="200",)"
                             R"(route="/stream"} 1)"));
}

TEST_F(HttpServerTest, SizeLimitAnswers413BeforeTheBody) {
  HttpServer::Options o;
  o.max_request_bytes = 100;
  Start(o);
  {
    Conn c(server_->port());
    ASSERT_TRUE(
        c.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
               "1000\r\n\r\n"));
    const std::string got = c.ReadUntil("}}");  // no body was sent
    EXPECT_THAT(got, StartsWith("HTTP/1.1 413"));
    EXPECT_THAT(got, HasSubstr("1000 bytes, over the limit of 100 bytes "
                               "(--max-request-bytes)"));
    EXPECT_THAT(got, HasSubstr("Connection: close"));
    EXPECT_TRUE(c.ReadEof());
  }
  Conn c(server_->port());
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: "
             "chunked\r\n\r\n"
             "50\r\n" +
             std::string(80, 'a') + "\r\n" + "50\r\n" + std::string(80, 'b') +
             "\r\n0\r\n\r\n"));
  const std::string got = c.ReadUntil("}}");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(got, HasSubstr("over the limit of 100 bytes"));
}

TEST_F(HttpServerTest, AuthGuardsAllButProbes) {
  auto auth = BearerAuth::FromTokens({"sekret-token"});
  ASSERT_TRUE(auth.ok());
  HttpServer::Options o;
  o.auth = auth->get();
  o.auth_metrics = true;
  Start(o);
  Conn c(server_->port());
  ASSERT_TRUE(c.Send(Get("/health")));
  EXPECT_THAT(c.ReadUntil("ok\n"), StartsWith("HTTP/1.1 200"));
  Conn m(server_->port());
  ASSERT_TRUE(m.Send(Get("/metrics")));
  const std::string denied = m.ReadUntil("}}");
  EXPECT_THAT(denied, StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(denied, HasSubstr("WWW-Authenticate: Bearer"));
  EXPECT_THAT(denied, Not(HasSubstr("sekret")));
  Conn e(server_->port());
  ASSERT_TRUE(
      e.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer "
             "sekret-token\r\nContent-Length: 2\r\n\r\nhi"));
  EXPECT_THAT(e.ReadUntil("echo:hi"), StartsWith("HTTP/1.1 200"));
}

TEST_F(HttpServerTest, ConnectionCapRefusesApiButServesProbes) {
  HttpServer::Options o;
  o.max_connections = 2;
  Start(o);
  Conn a(server_->port()), b(server_->port());
  // Both are open (and counted) once each has been answered.
  ASSERT_TRUE(a.Send(Get("/health")));
  ASSERT_TRUE(b.Send(Get("/health")));
  ASSERT_THAT(a.ReadUntil("ok\n"), HasSubstr("ok\n"));
  ASSERT_THAT(b.ReadUntil("ok\n"), HasSubstr("ok\n"));
  Conn c(server_->port());
  ASSERT_TRUE(
      c.Send("POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1"
             "\r\n\r\nx"));
  const std::string got = c.ReadUntil("}}");
  EXPECT_THAT(got, StartsWith("HTTP/1.1 429"));
  EXPECT_THAT(got, HasSubstr("Retry-After: 1\r\n"));
  EXPECT_THAT(got, HasSubstr("--http-max-connections"));
  Conn d(server_->port());
  ASSERT_TRUE(d.Send(Get("/ready")));
  EXPECT_THAT(d.ReadUntil("ready\n"), StartsWith("HTTP/1.1 200"));
}

TEST_F(HttpServerTest, StreamsChunksInOrderAndReportsEachSent) {
  Start();
  Conn c(server_->port());
  ASSERT_TRUE(c.Send(Get("/stream")));
  const std::string got = c.ReadUntil("0\r\n\r\n");
  EXPECT_THAT(got, HasSubstr("Transfer-Encoding: chunked"));
  EXPECT_THAT(got, HasSubstr("8\r\npiece 0\n\r\n8\r\npiece 1\n\r\n"
                             "8\r\npiece 2\n\r\n0\r\n\r\n"));
  EXPECT_EQ(sent_.load(), 3);
  // The connection stays usable.
  ASSERT_TRUE(c.Send(Get("/health")));
  EXPECT_THAT(c.ReadUntil("ok\n"), HasSubstr("ok\n"));
}

TEST_F(HttpServerTest, ClientGoneIsNoticedWithoutAWrite) {
  Start();
  {
    Conn c(server_->port());
    ASSERT_TRUE(c.Send(Get("/hold")));
    ASSERT_THAT(c.ReadUntil("held\n"), HasSubstr("held\n"));
  }  // closes
  EXPECT_TRUE(closed_.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST_F(HttpServerTest, StopWhileAnExchangeIsHeldElsewhere) {
  Start();
  Conn c(server_->port());
  ASSERT_TRUE(c.Send(Get("/hold")));
  ASSERT_THAT(c.ReadUntil("held\n"), HasSubstr("held\n"));
  server_->Stop();
  EXPECT_TRUE(closed_.HasBeenNotified());  // Stop closed the stream
  EXPECT_TRUE(c.ReadEof());
  absl::MutexLock lock(&mu_);
  ASSERT_NE(held_, nullptr);
  // The server is gone: these do nothing (and must not crash).
  held_->Write("late", [](bool) { ADD_FAILURE() << "sent after Stop"; });
  held_->EndStream();
  server_.reset();
  held_.reset();
}

// The daemon's shutdown: the engine has drained, but a stream's last
// writes are still on their way. Stop(grace) closes idle connections at
// once, lets the stream finish (every byte and the terminating chunk), and
// returns once its connection is gone; a plain Stop() would cut it.
TEST_F(HttpServerTest, GracefulStopLetsTheResponseInProgressFinish) {
  Start();
  Conn streaming(server_->port()), idle(server_->port());
  ASSERT_TRUE(streaming.Send(Get("/hold")));
  ASSERT_THAT(streaming.ReadUntil("held\n"), HasSubstr("held\n"));
  ASSERT_TRUE(idle.Send(Get("/health")));
  ASSERT_THAT(idle.ReadUntil("ok\n"), HasSubstr("ok\n"));
  std::thread stopper([this] { server_->Stop(absl::Seconds(30)); });
  EXPECT_TRUE(idle.ReadEof());  // closed by the stop, not by its timeout
  {
    absl::MutexLock lock(&mu_);
    ASSERT_NE(held_, nullptr);
    held_->Write("tail\n", [](bool) {});
    held_->EndStream();
    held_.reset();
  }
  const std::string got = streaming.ReadUntil("0\r\n\r\n");
  EXPECT_THAT(got, HasSubstr("5\r\ntail\n\r\n0\r\n\r\n"));
  EXPECT_TRUE(streaming.ReadEof());  // then the server ends the connection
  streaming.Close();
  stopper.join();  // returns when the connection is gone, well before 30 s
  EXPECT_FALSE(closed_.HasBeenNotified());  // finished, not cut
}

}  // namespace
}  // namespace kvserve::server
