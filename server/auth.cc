#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kvserve::server {
namespace {

constexpr absl::string_view kBearer = "bearer ";

// Printable ASCII without spaces: what fits in an HTTP header and a gRPC
// metadata value unchanged.
bool IsTokenChar(char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

absl::StatusOr<BearerAuth> BearerAuth::FromFile(const std::string& path,
                                                const std::string& flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::vector<std::string> tokens;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty() || t[0] == '#') continue;
    for (char c : t) {
      if (!IsTokenChar(c)) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": '", path, "' line ", line_no,
                         ": a token must be printable ASCII without spaces"));
      }
    }
    tokens.emplace_back(t);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path,
                     "' holds no token (one per line; '#' starts a comment)"));
  }
  return FromTokens(tokens);
}

absl::StatusOr<BearerAuth> BearerAuth::FromTokens(
    const std::vector<std::string>& tokens) {
  if (tokens.empty()) {
    return absl::InvalidArgumentError("auth: at least one token is required");
  }
  BearerAuth auth;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string& t = tokens[i];
    bool ok = !t.empty();
    for (char c : t) ok = ok && IsTokenChar(c);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth: token ", i + 1,
                       " must be non-empty printable ASCII without spaces"));
    }
    Digest d;
    SHA256(reinterpret_cast<const unsigned char*>(t.data()), t.size(),
           d.data());
    auth.digests_.push_back(d);
  }
  return auth;
}

bool BearerAuth::Accepts(absl::string_view token) const {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         d.data());
  // Every digest is compared, whatever matched before.
  int matched = 0;
  for (const Digest& known : digests_) {
    matched |= CRYPTO_memcmp(known.data(), d.data(), d.size()) == 0;
  }
  return matched != 0;
}

absl::Status BearerAuth::CheckAuthorization(absl::string_view value,
                                            bool present) const {
  if (!present) {
    return absl::UnauthenticatedError(
        "authorization: missing; send 'Authorization: Bearer <token>'");
  }
  if (value.size() < kBearer.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
    return absl::UnauthenticatedError(
        "authorization: expected 'Bearer <token>'");
  }
  if (!Accepts(absl::StripAsciiWhitespace(value.substr(kBearer.size())))) {
    return absl::UnauthenticatedError("authorization: invalid token");
  }
  return absl::OkStatus();
}

absl::Status CheckGrpcAuth(const BearerAuth* auth,
                           const grpc::CallbackServerContext& ctx) {
  if (auth == nullptr) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  if (it == md.end()) return auth->CheckAuthorization("", false);
  return auth->CheckAuthorization(
      absl::string_view(it->second.data(), it->second.size()), true);
}

}  // namespace kvserve::server
