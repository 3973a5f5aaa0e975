// Bearer-token authentication for the daemon's APIs (--auth-token-file).
// Owns the token file format (one token per line; blank lines and lines
// starting with '#' are skipped; surrounding whitespace is trimmed), the
// parsing of "Authorization: Bearer <token>", and the comparison.
//
// Invariants: the tokens are kept only as SHA-256 digests, and a presented
// token is hashed and compared against every digest with CRYPTO_memcmp, so
// the time taken does not depend on how much of a token matched nor on
// which token did. No function here logs, and no error message contains a
// token or a file line (the token must never reach a log).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace kvserve::server {

class BearerAuth {
 public:
  // Reads the token file. InvalidArgument naming `flag` and the path when
  // the file cannot be read, holds no token, or a token has a character
  // outside printable ASCII (or a space); the message names the line number,
  // never its text.
  [[nodiscard]] static absl::StatusOr<BearerAuth> FromFile(
      const std::string& path, const std::string& flag = "--auth-token-file");
  // From tokens in memory (tests). Same checks as FromFile.
  [[nodiscard]] static absl::StatusOr<BearerAuth> FromTokens(
      const std::vector<std::string>& tokens);

  int num_tokens() const { return static_cast<int>(digests_.size()); }

  // True if `token` is one of the tokens. Constant time in the token.
  [[nodiscard]] bool Accepts(absl::string_view token) const;

  // Checks the value of an Authorization header ("Bearer <token>"; the
  // scheme is case-insensitive). Unauthenticated saying what was wrong
  // (missing, not Bearer, or not accepted) otherwise.
  [[nodiscard]] absl::Status CheckAuthorization(absl::string_view header_value,
                                                bool header_present) const;

 private:
  using Digest = std::array<uint8_t, 32>;
  std::vector<Digest> digests_;
};

// Checks the "authorization" metadata of a gRPC call; OK when `auth` is
// null (authentication off). Use at the top of every handler.
[[nodiscard]] absl::Status CheckGrpcAuth(
    const BearerAuth* auth, const grpc::CallbackServerContext& ctx);

}  // namespace kvserve::server
