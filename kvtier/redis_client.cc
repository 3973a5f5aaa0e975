#include "kvtier/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvserve::kvtier {
namespace {

constexpr absl::string_view kScheme = "redis://";

timeval TimevalOf(absl::Duration d) {
  d = std::max(d, absl::Milliseconds(1));
  return absl::ToTimeval(d);
}

}  // namespace

absl::StatusOr<RedisTarget> ParseRedisUrl(absl::string_view url) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-remote-cache '", url, "': ", why,
                     " (expected redis://HOST[:PORT][/DB])"));
  };
  if (!absl::StartsWith(url, kScheme)) return bad("not a redis:// URL");
  absl::string_view rest = url.substr(kScheme.size());
  if (rest.find('@') != absl::string_view::npos) {
    return bad(
        "credentials do not belong in the URL; use "
        "--kv-remote-cache-password-file or KVSERVE_REDIS_PASSWORD");
  }
  RedisTarget t;
  if (const size_t slash = rest.find('/'); slash != absl::string_view::npos) {
    const absl::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!absl::SimpleAtoi(db, &t.db) || t.db < 0)) {
      return bad("the DB must be a number >= 0");
    }
    rest = rest.substr(0, slash);
  }
  if (const size_t colon = rest.rfind(':'); colon != absl::string_view::npos) {
    if (!absl::SimpleAtoi(rest.substr(colon + 1), &t.port) || t.port < 1 ||
        t.port > 65535) {
      return bad("the port must be 1..65535");
    }
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return bad("no host");
  t.host = std::string(rest);
  return t;
}

void ReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }

ReplyKind KindOf(const redisReply& r) {
  switch (r.type) {
    case REDIS_REPLY_STRING:
      return ReplyKind::kString;
    case REDIS_REPLY_NIL:
      return ReplyKind::kNil;
    case REDIS_REPLY_INTEGER:
      return ReplyKind::kInteger;
    case REDIS_REPLY_ARRAY:
      return ReplyKind::kArray;
    case REDIS_REPLY_STATUS:
      return ReplyKind::kStatus;
    default:
      return ReplyKind::kError;
  }
}

absl::string_view StringOf(const redisReply& r) {
  return r.str == nullptr ? absl::string_view()
                          : absl::string_view(r.str, r.len);
}
long long IntegerOf(const redisReply& r) { return r.integer; }
size_t ArraySize(const redisReply& r) { return r.elements; }
const redisReply& ArrayAt(const redisReply& r, size_t i) {
  return *r.element[i];
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RedisConnection::Connect(
    const RedisTarget& target, const RedisAuth& auth, absl::Duration timeout) {
  redisContext* ctx = redisConnectWithTimeout(target.host.c_str(), target.port,
                                              TimevalOf(timeout));
  if (ctx == nullptr) {
    return absl::ResourceExhaustedError("redis: out of memory");
  }
  std::unique_ptr<RedisConnection> c(new RedisConnection(ctx));
  if (ctx->err != 0) {
    return absl::UnavailableError(absl::StrCat("redis ", target.host, ":",
                                               target.port, ": ", ctx->errstr));
  }
  // Large values: never shrink the read buffer between replies (hiredis
  // would move the rest of a multi-megabyte pipeline each time).
  ctx->reader->maxbuf = 0;
  std::vector<RedisCommand> setup;
  if (!auth.password.empty()) {
    if (auth.user.empty()) {
      setup.push_back({"AUTH", auth.password});
    } else {
      setup.push_back({"AUTH", auth.user, auth.password});
    }
  }
  const std::string db = absl::StrCat(target.db);
  if (target.db != 0) setup.push_back({"SELECT", db});
  setup.push_back({"PING"});
  absl::StatusOr<std::vector<RedisReply>> replies = c->Pipeline(setup, timeout);
  if (!replies.ok()) return replies.status();
  for (const RedisReply& r : *replies) {
    if (KindOf(*r) != ReplyKind::kError) continue;
    const absl::string_view msg = StringOf(*r);
    if (absl::StartsWith(msg, "NOAUTH") || absl::StartsWith(msg, "WRONGPASS") ||
        absl::StrContains(msg, "AUTH")) {
      return absl::PermissionDeniedError(
          absl::StrCat("redis ", target.host, ":", target.port, ": ", msg));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("redis ", target.host, ":", target.port, ": ", msg));
  }
  return c;
}

RedisConnection::~RedisConnection() { redisFree(ctx_); }

absl::Status RedisConnection::SetTimeout(absl::Duration timeout) {
  if (timeout == timeout_) return absl::OkStatus();
  if (redisSetTimeout(ctx_, TimevalOf(timeout)) != REDIS_OK) {
    return ContextError();
  }
  timeout_ = timeout;
  return absl::OkStatus();
}

absl::Status RedisConnection::ContextError() {
  broken_ = true;
  const bool timed_out =
      ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
  const std::string what =
      ctx_->errstr[0] != 0 ? ctx_->errstr : "connection lost";
  if (timed_out) return absl::DeadlineExceededError("redis: timed out");
  return absl::UnavailableError(absl::StrCat("redis: ", what));
}

absl::StatusOr<std::vector<RedisReply>> RedisConnection::Pipeline(
    absl::Span<const RedisCommand> commands, absl::Duration timeout) {
  if (broken_) return absl::UnavailableError("redis: connection broken");
  if (absl::Status s = SetTimeout(timeout); !s.ok()) return s;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const RedisCommand& cmd : commands) {
    argv.clear();
    lens.clear();
    for (absl::string_view a : cmd) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(),
                               lens.data()) != REDIS_OK) {
      return ContextError();
    }
  }
  std::vector<RedisReply> replies;
  replies.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* r = nullptr;
    errno = 0;
    if (redisGetReply(ctx_, &r) != REDIS_OK || r == nullptr) {
      return ContextError();
    }
    replies.emplace_back(static_cast<redisReply*>(r));
  }
  return replies;
}

}  // namespace kvserve::kvtier
