// The checks on a request's head (server/http_checks.h): framing, Host and
// Content-Type, each refused with its status and a message naming the
// header.
#include "server/http_checks.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::server {
namespace {

using ::testing::HasSubstr;

HttpRequest Head(std::string method, std::string path,
                 std::vector<std::pair<std::string, std::string>> headers) {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.headers = std::move(headers);
  return r;
}

TEST(HostPolicyTest, LoopbackBindAcceptsLoopbackNamesOnly) {
  const HostPolicy p("127.0.0.1", {});
  for (const char* ok :
       {"127.0.0.1", "127.0.0.1:9090", "localhost", "LOCALHOST:80",
        "localhost.", "[::1]:9090", "127.1.2.3", "app.localhost"}) {
    EXPECT_TRUE(p.Allows(ok)) << ok;
  }
  for (const char* bad : {"evil.example", "evil.example:9090", "10.0.0.5", "",
                          "localhost:x", "[::1", "127.0.0.1:80:90"}) {
    EXPECT_FALSE(p.Allows(bad)) << bad;
  }
}

TEST(HostPolicyTest, WildcardBindAcceptsIpLiteralsAndNamedHosts) {
  const HostPolicy p("0.0.0.0", {"kvserve.default.svc", "Api.Example.com"});
  for (const char* ok : {"10.1.2.3:9090", "[fe80::1]:80", "kvserve.default.svc",
                         "api.example.com:443"}) {
    EXPECT_TRUE(p.Allows(ok)) << ok;
  }
  for (const char* bad : {"localhost", "rebound.attacker.example"}) {
    EXPECT_FALSE(p.Allows(bad)) << bad;
  }
}

TEST(HostPolicyTest, SpecificBindAndStar) {
  const HostPolicy p("10.0.0.5", {});
  EXPECT_TRUE(p.Allows("10.0.0.5:9090"));
  EXPECT_FALSE(p.Allows("10.0.0.6:9090"));
  EXPECT_FALSE(p.Allows("localhost"));
  EXPECT_TRUE(HostPolicy("10.0.0.5", {"*"}).Allows("anything.example"));
}

TEST(CheckRequestHeadTest, RefusesEachProblemWithItsStatus) {
  const HostPolicy hosts("127.0.0.1", {});
  const std::vector<std::pair<std::string, std::string>> json = {
      {"host", "127.0.0.1:1"}, {"content-type", "application/json"}};
  EXPECT_FALSE(
      CheckRequestHead(Head("POST", "/v1/completions", json), 11, hosts));
  struct Case {
    HttpRequest head;
    unsigned version;
    int status;
    const char* message;
  };
  const std::vector<Case> cases = {
      {Head("POST", "/v1/completions",
            {{"host", "localhost"},
             {"content-type", "application/json"},
             {"transfer-encoding", "gzip"}}),
       11, 501, "transfer-encoding: 'gzip' is not supported"},
      {Head("POST", "/v1/completions",
            {{"host", "localhost"}, {"transfer-encoding", "identity"}}),
       11, 501, "only chunked"},
      {Head("POST", "/v1/completions",
            {{"host", "localhost"}, {"transfer-encoding", "gzip, chunked"}}),
       11, 501, "not supported"},
      {Head("GET", "/v1/models", {}), 11, 400, "host: missing"},
      {Head("GET", "/v1/models", {{"host", "a"}, {"host", "b"}}), 11, 400,
       "more than one Host"},
      {Head("GET", "/v1/kv/state", {{"host", "rebind.example:9090"}}), 11, 403,
       "host: 'rebind.example:9090' is not a name of this server"},
      {Head("POST", "/v1/completions",
            {{"host", "localhost"}, {"content-type", "text/plain"}}),
       11, 415, "content-type: must be application/json, got 'text/plain'"},
      {Head("POST", "/v1/chat/completions", {{"host", "localhost"}}), 11, 415,
       "content-type"},
  };
  for (const Case& c : cases) {
    std::optional<HeadRefusal> r = CheckRequestHead(c.head, c.version, hosts);
    ASSERT_TRUE(r.has_value()) << c.message;
    EXPECT_EQ(r->status, c.status) << c.message;
    EXPECT_THAT(r->message, HasSubstr(c.message));
  }
}

TEST(CheckRequestHeadTest, ProbesHttp10AndCharsetPass) {
  const HostPolicy hosts("127.0.0.1", {});
  // Probes are exempt from the Host check (the k8s kubelet sends the pod
  // IP, or anything).
  EXPECT_FALSE(CheckRequestHead(
      Head("GET", "/health", {{"host", "probe.example"}}), 11, hosts));
  EXPECT_FALSE(CheckRequestHead(
      Head("GET", "/ready", {{"host", "probe.example"}}), 11, hosts));
  // HTTP/1.0 may omit Host.
  EXPECT_FALSE(CheckRequestHead(Head("GET", "/v1/models", {}), 10, hosts));
  EXPECT_FALSE(CheckRequestHead(
      Head("POST", "/v1/completions",
           {{"host", "localhost"},
            {"content-type", "Application/JSON; charset=utf-8"},
            {"transfer-encoding", "Chunked"}}),
      11, hosts));
}

TEST(CheckDeclaredLengthTest, RefusesADeclaredLengthOverTheLimit) {
  EXPECT_FALSE(CheckDeclaredLength(std::nullopt, 1024));
  EXPECT_FALSE(CheckDeclaredLength(1024, 1024));
  const std::optional<HeadRefusal> no =
      CheckDeclaredLength(uint64_t{22222222222221}, 1024);
  ASSERT_TRUE(no.has_value());
  EXPECT_EQ(no->status, 413);
  EXPECT_STREQ(no->code, "request_too_large");
  EXPECT_THAT(no->message, HasSubstr("22222222222221 bytes, over the limit of "
                                     "1024 bytes (--max-request-bytes)"));
}

}  // namespace
}  // namespace kvserve::server
