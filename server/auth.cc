#include "server/auth.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvserve::server {
namespace {

constexpr absl::string_view kBearer = "bearer ";

}  // namespace

absl::StatusOr<std::unique_ptr<BearerAuth>> BearerAuth::FromFile(
    const std::string& path, const TenantDefaults& defaults,
    const std::string& flag) {
  absl::StatusOr<TenantTable> table =
      TenantTable::FromFile(path, defaults, flag);
  if (!table.ok()) return table.status();
  return std::unique_ptr<BearerAuth>(new BearerAuth(
      path, defaults, std::make_shared<const TenantTable>(*std::move(table))));
}

absl::StatusOr<std::unique_ptr<BearerAuth>> BearerAuth::FromTokens(
    const std::vector<std::string>& tokens) {
  if (tokens.empty()) {
    return absl::InvalidArgumentError("auth: at least one token is required");
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    bool ok = !tokens[i].empty();
    for (char c : tokens[i]) ok = ok && c > 0x20 && c < 0x7f;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("auth: token ", i + 1,
                       " must be non-empty printable ASCII without spaces"));
    }
  }
  absl::StatusOr<TenantTable> table =
      TenantTable::Parse(absl::StrJoin(tokens, "\n"), TenantDefaults{}, "auth");
  if (!table.ok()) return table.status();
  return std::unique_ptr<BearerAuth>(
      new BearerAuth("", TenantDefaults{},
                     std::make_shared<const TenantTable>(*std::move(table))));
}

absl::Status BearerAuth::Reload() {
  if (path_.empty()) return absl::OkStatus();
  absl::StatusOr<TenantTable> table = TenantTable::FromFile(path_, defaults_);
  if (!table.ok()) return table.status();
  auto fresh = std::make_shared<const TenantTable>(*std::move(table));
  absl::MutexLock lock(&mu_);
  table_ = std::move(fresh);
  return absl::OkStatus();
}

std::shared_ptr<const TenantTable> BearerAuth::table() const {
  absl::MutexLock lock(&mu_);
  return table_;
}

absl::StatusOr<TenantRef> BearerAuth::Authenticate(absl::string_view value,
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
  TenantRef tenant =
      table()->Find(absl::StripAsciiWhitespace(value.substr(kBearer.size())));
  if (tenant == nullptr) {
    return absl::UnauthenticatedError("authorization: invalid token");
  }
  return tenant;
}

absl::StatusOr<TenantRef> AuthenticateGrpc(
    const BearerAuth* auth, const TenantRef& single,
    const grpc::CallbackServerContext& ctx) {
  if (auth == nullptr) return single;
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  if (it == md.end()) return auth->Authenticate("", false);
  return auth->Authenticate(
      absl::string_view(it->second.data(), it->second.size()), true);
}

}  // namespace kvserve::server
