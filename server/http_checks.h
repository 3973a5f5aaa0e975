// The checks the HTTP server applies to a request's head before it reads
// the body (http_session.cc), as pure functions of the parsed head so that
// they are tested and fuzzed without sockets:
//   - framing: a Transfer-Encoding other than exactly "chunked" is 501 (RFC
//     9112 6.1: the server does not understand it, and reading such a body
//     as empty would let its bytes run as the next request); HTTP/1.1
//     without exactly one Host is 400 (RFC 9112 3.2);
//   - Host: only names of this server (HostPolicy), so that a web page
//     whose DNS name is rebound to the server's address cannot drive it
//     (403; the probes /health and /ready are exempt);
//   - Content-Type: a POST to the API (/v1/) carries application/json (415
//     otherwise), so
//     that a cross-site page cannot send one without a CORS preflight,
//     which the server never grants;
//   - size: a declared Content-Length over the body limit is 413 before a
//     byte of the body is read (Beast reserves the declared length when the
//     body starts, so the check must come first).
// Owns no state beyond the policy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/http_server.h"

namespace kvserve::server {

// Which Host header values name this server.
class HostPolicy {
 public:
  // `bound`: the address the server listens on (--host); `allowed`: more
  // names (--allowed-hosts; "*" allows every Host). Loopback names
  // (localhost, 127.0.0.0/8, ::1) when bound to loopback; the bound IP
  // literal otherwise, and any IP literal when bound to a wildcard
  // (0.0.0.0, ::), since an IP literal cannot be rebound.
  HostPolicy(const std::string& bound, const std::vector<std::string>& allowed);
  HostPolicy() : any_(true) {}  // no check

  // `value`: a Host header ("name", "name:port", "[v6]:port").
  [[nodiscard]] bool Allows(absl::string_view value) const;

 private:
  bool any_ = false;
  bool loopback_ = false;           // bound to a loopback address or name
  bool wildcard_ = false;           // bound to 0.0.0.0 or ::
  std::string bound_ip_;            // the bound IP literal, canonical
  std::vector<std::string> names_;  // lower case, no trailing dot
};

struct HeadRefusal {
  int status = 400;
  std::string message;
  const char* code = "bad_request";  // the OpenAI error body's code
};

// "request body: N bytes, over the limit of L bytes (--max-request-bytes)";
// without `got`, the size is not known (a chunked body over the limit).
[[nodiscard]] std::string TooLargeMessage(uint64_t limit,
                                          std::optional<uint64_t> got);

// 413 when `declared` (the Content-Length, if any) is over `limit`.
[[nodiscard]] std::optional<HeadRefusal> CheckDeclaredLength(
    std::optional<uint64_t> declared, uint64_t limit);

// The checks above, in that order; nullopt when the request may go on.
// `version`: 10 or 11.
[[nodiscard]] std::optional<HeadRefusal> CheckRequestHead(
    const HttpRequest& head, unsigned version, const HostPolicy& hosts);

}  // namespace kvserve::server
