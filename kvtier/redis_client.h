// A Redis/Valkey connection for the KV tiers (hiredis, its blocking API):
// where the store is (redis://HOST:PORT[/DB]), who we are (AUTH), and
// pipelined commands under a per-call timeout. One connection serves one
// thread at a time; after any error it is broken and must be dropped (a
// reply may still be in flight). No TLS: hiredis 0.14 has none, so the
// store must be on a private network or behind a TLS tunnel.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

struct redisContext;
struct redisReply;

namespace kvserve::kvtier {

struct RedisTarget {
  std::string host;
  int port = 6379;
  int db = 0;
};

// redis://HOST[:PORT][/DB]. InvalidArgument naming the flag for any other
// scheme, a password in the URL (it would show in `ps`), a bad port or DB.
[[nodiscard]] absl::StatusOr<RedisTarget> ParseRedisUrl(absl::string_view url);

struct RedisAuth {
  std::string user;  // empty: the default user
  std::string password;
};

struct ReplyDeleter {
  void operator()(redisReply* r) const;
};
using RedisReply = std::unique_ptr<redisReply, ReplyDeleter>;

// A reply's shape, for callers that do not include hiredis.
enum class ReplyKind { kString, kNil, kInteger, kArray, kStatus, kError };
[[nodiscard]] ReplyKind KindOf(const redisReply& r);
[[nodiscard]] absl::string_view StringOf(const redisReply& r);
[[nodiscard]] long long IntegerOf(const redisReply& r);
[[nodiscard]] size_t ArraySize(const redisReply& r);
[[nodiscard]] const redisReply& ArrayAt(const redisReply& r, size_t i);

using RedisCommand = std::vector<absl::string_view>;

class RedisConnection {
 public:
  // Connects, authenticates and selects the DB within `timeout`.
  // Unavailable when the store cannot be reached, PermissionDenied when it
  // refuses the credentials.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RedisConnection>> Connect(
      const RedisTarget& target, const RedisAuth& auth, absl::Duration timeout);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // Sends `commands` in one pipeline and reads their replies in order,
  // each read bounded by `timeout`. DeadlineExceeded on a timeout,
  // Unavailable on a broken connection; either way broken() turns true.
  // An error reply is a reply (KindOf == kError), not a failure.
  [[nodiscard]] absl::StatusOr<std::vector<RedisReply>> Pipeline(
      absl::Span<const RedisCommand> commands, absl::Duration timeout);
  [[nodiscard]] bool broken() const { return broken_; }

 private:
  explicit RedisConnection(redisContext* ctx) : ctx_(ctx) {}
  absl::Status SetTimeout(absl::Duration timeout);
  absl::Status ContextError();

  redisContext* ctx_;
  absl::Duration timeout_ = absl::ZeroDuration();
  bool broken_ = false;
};

}  // namespace kvserve::kvtier
