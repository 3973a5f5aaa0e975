// Fuzzes HTTP request framing as the server reads it (http_session.cc):
// the bytes go through Beast's request parser with the server's header
// limit, the head through the checks before the body (http_checks.h: the
// transfer coding, Host, Content-Type, the declared length), then the body
// up to a limit. Never
// a crash; a refusal is one of the documented statuses with a message; and
// the property that stops request smuggling: no request whose
// Transfer-Encoding is anything but exactly "chunked" passes the checks.
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "server/http_checks.h"

namespace kvserve::server {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

constexpr uint32_t kHeaderLimit = 16 * 1024;  // as http_session.cc
constexpr uint64_t kBodyLimit = 1 << 20;

// Feeds `in` to `p` until it needs more or is done. False on a parse error.
bool Feed(http::request_parser<http::string_body>& p, beast::flat_buffer& in,
          bool header_only) {
  beast::error_code ec;
  while (in.size() > 0 && !(header_only ? p.is_header_done() : p.is_done())) {
    const size_t n = p.put(in.data(), ec);
    in.consume(n);
    if (ec == http::error::need_more) return true;
    if (ec) return false;
    if (n == 0) return true;
  }
  return true;
}

void Fuzz(const uint8_t* data, size_t size) {
  static const HostPolicy* hosts = new HostPolicy("127.0.0.1", {});
  beast::flat_buffer in;
  in.commit(boost::asio::buffer_copy(in.prepare(size),
                                     boost::asio::buffer(data, size)));
  http::request_parser<http::string_body> p;
  p.header_limit(kHeaderLimit);
  p.body_limit(std::numeric_limits<uint64_t>::max());
  if (!Feed(p, in, /*header_only=*/true) || !p.is_header_done()) return;
  const auto& h = p.get();
  HttpRequest head;
  head.method = std::string(h.method_string());
  const std::string target(h.target());
  head.path = target.substr(0, target.find('?'));
  bool other_coding = false;
  for (const auto& field : h) {
    const std::string name = absl::AsciiStrToLower(
        std::string(field.name_string().data(), field.name_string().size()));
    const std::string value(field.value().data(), field.value().size());
    if (name == "transfer-encoding" &&
        !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(value), "chunked")) {
      other_coding = true;
    }
    head.headers.emplace_back(name, value);
  }
  int te_fields = 0;
  for (const auto& [name, value] : head.headers) {
    te_fields += name == "transfer-encoding" ? 1 : 0;
  }
  const std::optional<HeadRefusal> refusal =
      CheckRequestHead(head, h.version(), *hosts);
  if (refusal.has_value()) {
    const int s = refusal->status;
    if (s != 400 && s != 403 && s != 415 && s != 501) __builtin_trap();
    if (refusal->message.empty()) __builtin_trap();
    return;
  }
  if (other_coding || te_fields > 1) __builtin_trap();  // smuggling
  const boost::optional<uint64_t> declared = p.content_length();
  if (std::optional<HeadRefusal> too_large = CheckDeclaredLength(
          declared ? std::optional<uint64_t>(*declared) : std::nullopt,
          kBodyLimit)) {
    if (too_large->status != 413 || too_large->message.empty()) {
      __builtin_trap();
    }
    return;
  }
  p.body_limit(kBodyLimit);
  if (!Feed(p, in, /*header_only=*/false)) return;
  if (p.is_done() && p.get().body().size() > kBodyLimit) __builtin_trap();
}

}  // namespace
}  // namespace kvserve::server

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvserve::server::Fuzz(data, size);
  return 0;
}
