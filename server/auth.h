// Bearer-token authentication for the daemon's APIs (--auth-token-file):
// the live token -> tenant table (tenants.h), reloaded on SIGHUP, and the
// parsing of "Authorization: Bearer <token>" on HTTP and gRPC.
//
// Invariants: the tokens are kept only as SHA-256 digests and compared in
// constant time (TenantTable::Find). No function here logs, and no error
// message contains a token or a file line (the token must never reach a
// log). A reload that fails keeps the table in use; a request authenticated
// before a reload keeps the tenant it got (TenantRef).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "server/tenants.h"

namespace kvserve::server {

class BearerAuth {
 public:
  // Reads the token file. InvalidArgument naming `flag` and the path when
  // the file cannot be read, holds no token, or a line is malformed (the
  // message names the line number, never its text).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BearerAuth>> FromFile(
      const std::string& path, const TenantDefaults& defaults = {},
      const std::string& flag = "--auth-token-file");
  // From tokens in memory, each its own tenant (tests).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BearerAuth>> FromTokens(
      const std::vector<std::string>& tokens);

  // Reads the file again (SIGHUP). On error the current table stays and
  // the error says why. Thread-safe.
  [[nodiscard]] absl::Status Reload();

  [[nodiscard]] int num_tokens() const { return table()->num_tokens(); }
  [[nodiscard]] int num_tenants() const { return table()->num_tenants(); }
  // The table in use. Thread-safe.
  [[nodiscard]] std::shared_ptr<const TenantTable> table() const;

  // True if `token` is one of the tokens. Constant time in the token.
  [[nodiscard]] bool Accepts(absl::string_view token) const {
    return table()->Find(token) != nullptr;
  }

  // Checks the value of an Authorization header ("Bearer <token>"; the
  // scheme is case-insensitive) and returns the token's tenant;
  // Unauthenticated saying what was wrong (missing, not Bearer, or not
  // accepted) otherwise.
  [[nodiscard]] absl::StatusOr<TenantRef> Authenticate(
      absl::string_view header_value, bool header_present) const;

 private:
  BearerAuth(std::string path, TenantDefaults defaults,
             std::shared_ptr<const TenantTable> table)
      : path_(std::move(path)), defaults_(defaults), table_(std::move(table)) {}

  const std::string path_;  // empty: from tokens in memory
  const TenantDefaults defaults_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const TenantTable> table_ ABSL_GUARDED_BY(mu_);
};

// The tenant of a gRPC call from its "authorization" metadata; `single`
// when `auth` is null (authentication off). Use at the top of every
// handler.
[[nodiscard]] absl::StatusOr<TenantRef> AuthenticateGrpc(
    const BearerAuth* auth, const TenantRef& single,
    const grpc::CallbackServerContext& ctx);

}  // namespace kvserve::server
