#include "server/http_checks.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvserve::server {
namespace {

// Longest Host value quoted back in an error.
constexpr size_t kMaxQuoted = 128;

std::string Quote(absl::string_view v) {
  return absl::CHexEscape(v.substr(0, kMaxQuoted));
}

// The canonical text of an IP literal, or empty when `s` is none.
std::string CanonicalIp(absl::string_view s) {
  const std::string text(s);
  std::array<unsigned char, 16> addr;
  std::array<char, INET6_ADDRSTRLEN> out;
  for (const int family : {AF_INET, AF_INET6}) {
    if (inet_pton(family, text.c_str(), addr.data()) == 1 &&
        inet_ntop(family, addr.data(), out.data(), out.size()) != nullptr) {
      return std::string(out.data());
    }
  }
  return "";
}

bool IsLoopbackIp(const std::string& ip) {
  return ip == "::1" || absl::StartsWith(ip, "127.");
}

bool IsLoopbackName(absl::string_view name) {
  return name == "localhost" || absl::EndsWith(name, ".localhost");
}

// "name:port" / "[v6]:port" / "name" -> the name (lower case, no trailing
// dot), or empty when the value is malformed.
std::string HostName(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  absl::string_view name = value;
  absl::string_view port;
  if (absl::StartsWith(value, "[")) {
    const size_t close = value.find(']');
    if (close == absl::string_view::npos) return "";
    name = value.substr(1, close - 1);
    const absl::string_view rest = value.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return "";
      port = rest.substr(1);
    }
  } else if (std::count(value.begin(), value.end(), ':') == 1) {
    const size_t colon = value.find(':');
    name = value.substr(0, colon);
    port = value.substr(colon + 1);
  }
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return "";
  }
  std::string out = absl::AsciiStrToLower(name);
  if (absl::EndsWith(out, ".")) out.pop_back();
  return out;
}

}  // namespace

HostPolicy::HostPolicy(const std::string& bound,
                       const std::vector<std::string>& allowed) {
  for (const std::string& a : allowed) {
    if (a == "*") any_ = true;
    const std::string name = HostName(a);
    if (!name.empty()) names_.push_back(name);
  }
  const std::string ip = CanonicalIp(bound);
  if (ip.empty()) {
    const std::string name = HostName(bound);
    loopback_ = IsLoopbackName(name);
    if (!name.empty()) names_.push_back(name);
  } else {
    wildcard_ = ip == "0.0.0.0" || ip == "::";
    loopback_ = IsLoopbackIp(ip);
    bound_ip_ = ip;
  }
}

bool HostPolicy::Allows(absl::string_view value) const {
  if (any_) return true;
  const std::string name = HostName(value);
  if (name.empty()) return false;
  if (std::find(names_.begin(), names_.end(), name) != names_.end()) {
    return true;
  }
  const std::string ip = CanonicalIp(name);
  if (ip.empty()) return loopback_ && IsLoopbackName(name);
  return wildcard_ || ip == bound_ip_ || (loopback_ && IsLoopbackIp(ip));
}

std::optional<HeadRefusal> CheckRequestHead(const HttpRequest& head,
                                            unsigned version,
                                            const HostPolicy& hosts) {
  std::vector<const std::string*> host;
  std::vector<const std::string*> te;
  const std::string* type = nullptr;
  for (const auto& [name, value] : head.headers) {
    if (name == "host") host.push_back(&value);
    if (name == "transfer-encoding") te.push_back(&value);
    if (name == "content-type" && type == nullptr) type = &value;
  }
  if (!te.empty()) {
    std::vector<std::string> codings;
    for (const std::string* v : te) {
      for (absl::string_view c : absl::StrSplit(*v, ',')) {
        codings.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(c)));
      }
    }
    if (codings.size() != 1 || codings[0] != "chunked") {
      std::string all;
      for (const std::string* v : te)
        absl::StrAppend(&all, all.empty() ? "" : ", ", *v);
      return HeadRefusal{501,
                         absl::StrCat("transfer-encoding: '", Quote(all),
                                      "' is not supported (only chunked)"),
                         "not_implemented"};
    }
  }
  if (host.size() > 1) {
    return HeadRefusal{400, "host: more than one Host header", "bad_request"};
  }
  if (host.empty() && version >= 11) {
    return HeadRefusal{400, "host: missing (HTTP/1.1 requires it)",
                       "bad_request"};
  }
  const bool probe = head.path == "/health" || head.path == "/ready";
  if (!host.empty() && !probe && !hosts.Allows(*host[0])) {
    return HeadRefusal{403,
                       absl::StrCat("host: '", Quote(*host[0]),
                                    "' is not a name of this server (add it to "
                                    "--allowed-hosts)"),
                       "host_not_allowed"};
  }
  if (head.method == "POST" && absl::StartsWith(head.path, "/v1/")) {
    const absl::string_view media =
        type == nullptr
            ? ""
            : absl::StripAsciiWhitespace(
                  absl::string_view(*type).substr(0, type->find(';')));
    if (!absl::EqualsIgnoreCase(media, "application/json")) {
      return HeadRefusal{
          415,
          absl::StrCat("content-type: must be application/json, got '",
                       type == nullptr ? "" : Quote(*type), "'"),
          "unsupported_media_type"};
    }
  }
  return std::nullopt;
}

std::string TooLargeMessage(uint64_t limit, std::optional<uint64_t> got) {
  return got.has_value() ? absl::StrCat("request body: ", *got,
                                        " bytes, over the limit of ", limit,
                                        " bytes (--max-request-bytes)")
                         : absl::StrCat("request body: over the limit of ",
                                        limit, " bytes (--max-request-bytes)");
}

std::optional<HeadRefusal> CheckDeclaredLength(std::optional<uint64_t> declared,
                                               uint64_t limit) {
  if (!declared.has_value() || *declared <= limit) return std::nullopt;
  return HeadRefusal{413, TooLargeMessage(limit, declared),
                     "request_too_large"};
}

}  // namespace kvserve::server
