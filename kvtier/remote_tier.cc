#include "kvtier/remote_tier.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace kvserve::kvtier {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(30);
constexpr absl::Duration kSizeEvery = absl::Seconds(5);
// GETs per pipeline on a load: a few MB of values per round trip, and a
// miss early in the chain wastes at most one chunk.
constexpr size_t kLoadChunk = 8;
constexpr size_t kWriteBatch = 16;
constexpr size_t kMaxIdleConns = 8;

// A field of INFO's "name:value" lines.
uint64_t InfoField(absl::string_view info, absl::string_view name) {
  for (absl::string_view line : absl::StrSplit(info, "\r\n")) {
    if (line.size() > name.size() && line.substr(0, name.size()) == name &&
        line[name.size()] == ':') {
      uint64_t v = 0;
      if (absl::SimpleAtoi(line.substr(name.size() + 1), &v)) return v;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteTier>> RemoteTier::Open(
    const RemoteTierOptions& options, Key salt, uint64_t payload_bytes) {
  if (options.auth.password.empty()) {
    return absl::InvalidArgumentError(
        "--kv-remote-cache: the store holds prompts and needs a password: "
        "--kv-remote-cache-password-file FILE or KVSERVE_REDIS_PASSWORD "
        "(and requirepass or an ACL user on the store)");
  }
  if (options.max_queued_blocks < 1) {
    return absl::InvalidArgumentError("remote tier: max_queued_blocks < 1");
  }
  std::unique_ptr<RemoteTier> t(new RemoteTier(options, salt, payload_bytes));
  // One connection now, so a misconfiguration is logged at start; a store
  // that is down leaves the tier unhealthy, retried on use.
  absl::StatusOr<std::unique_ptr<RedisConnection>> c =
      t->Acquire(options.timeout);
  if (c.ok()) t->Return(*std::move(c));
  t->writer_ = std::thread([p = t.get()] { p->WriterLoop(); });
  return t;
}

RemoteTier::RemoteTier(const RemoteTierOptions& options, Key salt,
                       uint64_t payload_bytes)
    : options_(options),
      salt_(salt),
      payload_bytes_(payload_bytes),
      prefix_(absl::StrCat("kvserve:v1:", Hex128(salt), ":")) {}

RemoteTier::~RemoteTier() {
  {
    // What Flush did not write is dropped: a slow store must not hold up
    // the shutdown.
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string RemoteTier::KeyOf(Key key, uint64_t scope_tag,
                              uint64_t salt_tag) const {
  return absl::StrFormat("%s%016x:%016x:%s", prefix_, scope_tag, salt_tag,
                         Hex128(key));
}

std::string RemoteTier::Describe() const {
  return absl::StrCat("redis://", options_.target.host, ":",
                      options_.target.port, "/", options_.target.db);
}

absl::StatusOr<std::unique_ptr<RedisConnection>> RemoteTier::Acquire(
    absl::Duration timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_conns_.empty()) {
      std::unique_ptr<RedisConnection> c = std::move(idle_conns_.back());
      idle_conns_.pop_back();
      return c;
    }
    if (absl::Now() < paused_until_) {
      return absl::UnavailableError("remote tier backing off");
    }
  }
  absl::StatusOr<std::unique_ptr<RedisConnection>> c =
      RedisConnection::Connect(options_.target, options_.auth, timeout);
  if (!c.ok()) {
    OnError(c.status());
    return c.status();
  }
  OnOk();
  return c;
}

absl::StatusOr<std::vector<RedisReply>> RemoteTier::Run(
    std::unique_ptr<RedisConnection>& c,
    absl::Span<const RedisCommand> commands, absl::Duration timeout) {
  absl::StatusOr<std::vector<RedisReply>> r = c->Pipeline(commands, timeout);
  if (r.ok() || !absl::IsUnavailable(r.status())) return r;
  absl::StatusOr<std::unique_ptr<RedisConnection>> fresh =
      RedisConnection::Connect(options_.target, options_.auth, timeout);
  if (!fresh.ok()) return fresh.status();
  c = *std::move(fresh);
  return c->Pipeline(commands, timeout);
}

void RemoteTier::Return(std::unique_ptr<RedisConnection> c) {
  if (c == nullptr || c->broken()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_conns_.size() < kMaxIdleConns) idle_conns_.push_back(std::move(c));
}

void RemoteTier::OnError(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.errors;
  const bool was_healthy = stats_.healthy;
  backoff_ = backoff_ == absl::ZeroDuration()
                 ? kFirstBackoff
                 : std::min(backoff_ * 2, kMaxBackoff);
  paused_until_ = absl::Now() + backoff_;
  stats_.healthy = false;
  // Connections made before the fault are suspect too.
  idle_conns_.clear();
  if (was_healthy) {
    spdlog::warn(
        "kv remote tier {}: {}; loads miss and stores are dropped while it "
        "is retried with backoff",
        Describe(), s.ToString());
  }
  stats_.stores_dropped[static_cast<int>(DropReason::kUnhealthy)] +=
      queue_.size();
  queue_.clear();
}

void RemoteTier::OnOk() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stats_.healthy) spdlog::info("kv remote tier {}: healthy", Describe());
  stats_.healthy = true;
  backoff_ = absl::ZeroDuration();
}

bool RemoteTier::healthy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_.healthy || absl::Now() >= paused_until_;
}

void RemoteTier::CountMiss(MissReason r, uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.misses[static_cast<int>(r)] += n;
}

std::optional<MissReason> RemoteTier::Verify(const redisReply& r,
                                             const LoadBlock& b, Key ns) const {
  const ReplyKind kind = KindOf(r);
  if (kind == ReplyKind::kNil) return MissReason::kAbsent;
  if (kind != ReplyKind::kString) return MissReason::kFingerprint;
  const absl::string_view v = StringOf(r);
  if (v.size() < kHeaderBytes) return MissReason::kChecksum;
  // A copy: a sealed header's token ids are decrypted in place.
  uint8_t header[kHeaderBytes];
  std::memcpy(header, v.data(), kHeaderBytes);
  const Expected want{salt_,
                      b.key,
                      b.parent,
                      ns,
                      b.tokens,
                      payload_bytes_,
                      options_.cipher.get()};
  if (std::optional<MissReason> m = CheckHeader(header, v.size(), want)) {
    return m;
  }
  ChecksumCheck check(header);
  const auto* src = reinterpret_cast<const uint8_t*>(v.data()) + kHeaderBytes;
  for (const Piece& p : b.dst) {
    std::memcpy(p.data, src, p.bytes);
    check.Add(p.data, p.bytes);
    src += p.bytes;
  }
  if (!check.Matches()) return MissReason::kChecksum;
  if (want.cipher != nullptr)
    return OpenBlock(*want.cipher, header, b.dst, want);
  return std::nullopt;
}

std::pair<int32_t, std::optional<MissReason>> RemoteTier::LoadRun(
    absl::Span<const LoadBlock> blocks, Key ns, uint64_t scope_tag,
    absl::Time deadline) {
  absl::StatusOr<std::unique_ptr<RedisConnection>> conn =
      Acquire(std::min(options_.timeout, deadline - absl::Now()));
  if (!conn.ok()) {
    if (absl::IsDeadlineExceeded(conn.status())) {
      return {0, MissReason::kDeadline};  // the caller counts it
    }
    CountMiss(MissReason::kUnavailable);
    return {0, MissReason::kUnavailable};
  }
  const uint64_t salt_tag = SaltTag(ns);
  int32_t verified = 0;
  std::vector<std::string> keys;
  std::vector<RedisCommand> cmds;
  for (size_t start = 0; start < blocks.size(); start += kLoadChunk) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      // Counted by the caller, which owns the deadline.
      Return(*std::move(conn));
      return {verified, MissReason::kDeadline};
    }
    const size_t end = std::min(blocks.size(), start + kLoadChunk);
    keys.clear();
    cmds.clear();
    for (size_t i = start; i < end; ++i) {
      keys.push_back(KeyOf(blocks[i].key, scope_tag, salt_tag));
    }
    for (const std::string& k : keys) cmds.push_back({"GET", k});
    absl::StatusOr<std::vector<RedisReply>> replies =
        Run(*conn, cmds, std::min(left, options_.timeout));
    if (!replies.ok()) {
      OnError(replies.status());
      if (absl::IsDeadlineExceeded(replies.status())) {
        return {verified, MissReason::kDeadline};  // the caller counts it
      }
      CountMiss(MissReason::kUnavailable);
      return {verified, MissReason::kUnavailable};
    }
    for (size_t i = start; i < end; ++i) {
      const std::optional<MissReason> miss =
          Verify(*(*replies)[i - start], blocks[i], ns);
      if (!miss.has_value()) {
        ++verified;
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.hits;
        continue;
      }
      if (*miss != MissReason::kAbsent) {
        // A value that failed verification is never served again.
        const std::vector<RedisCommand> del = {{"UNLINK", keys[i - start]}};
        (void)(*conn)->Pipeline(del, options_.timeout);
      }
      Return(*std::move(conn));
      CountMiss(*miss);
      return {verified, miss};
    }
  }
  Return(*std::move(conn));
  return {verified, std::nullopt};
}

bool RemoteTier::Store(StoreItem item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return false;
    if (!stats_.healthy && absl::Now() < paused_until_) {
      ++stats_.stores_dropped[static_cast<int>(DropReason::kUnhealthy)];
      return false;
    }
    if (queue_.size() >= static_cast<size_t>(options_.max_queued_blocks)) {
      ++stats_.stores_dropped[static_cast<int>(DropReason::kQueueFull)];
      return false;
    }
    queue_.push_back(std::move(item));
  }
  wake_.notify_one();
  return true;
}

void RemoteTier::WriterLoop() {
  pthread_setname_np(pthread_self(), "kv-tier-remote");  // for top -H
  std::unique_ptr<RedisConnection> conn;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait_for(lock, absl::ToChronoNanoseconds(kSizeEvery),
                   [&] { return stop_ || !queue_.empty(); });
    if (stop_ && queue_.empty()) return;
    const bool size_due = absl::Now() - sized_at_ >= kSizeEvery;
    if (queue_.empty() && !size_due) continue;
    std::vector<StoreItem> batch;
    while (!queue_.empty() && batch.size() < kWriteBatch) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writing_ = true;
    lock.unlock();
    if (conn == nullptr || conn->broken()) {
      absl::StatusOr<std::unique_ptr<RedisConnection>> c =
          Acquire(options_.timeout);
      conn = c.ok() ? *std::move(c) : nullptr;
    }
    int written = 0;
    bool failed = conn == nullptr;
    if (conn != nullptr && !batch.empty()) {
      const absl::Time t0 = absl::Now();
      absl::StatusOr<int> w = WriteBatch(conn, batch);
      if (w.ok()) {
        written = *w;
        if (options_.observe_store && written > 0) {
          const double per = SecondsSince(t0) / written;
          for (int i = 0; i < written; ++i) options_.observe_store(per);
        }
      } else {
        OnError(w.status());
        failed = true;
      }
    }
    if (conn != nullptr && !failed && size_due) RefreshSize(conn);
    lock.lock();
    writing_ = false;
    stats_.stores += written;
    if (failed) {
      stats_.stores_dropped[static_cast<int>(DropReason::kUnhealthy)] +=
          batch.size();
    }
    if (queue_.empty()) idle_.notify_all();
  }
}

absl::StatusOr<int> RemoteTier::WriteBatch(
    std::unique_ptr<RedisConnection>& c, const std::vector<StoreItem>& batch) {
  std::vector<std::string> keys;
  std::vector<RedisCommand> cmds;
  keys.reserve(batch.size());
  cmds.reserve(batch.size());
  for (const StoreItem& it : batch) {
    keys.push_back(KeyOf(it.header.key, it.scope_tag, SaltTag(it.header.ns)));
  }
  for (const std::string& k : keys) cmds.push_back({"EXISTS", k});
  absl::StatusOr<std::vector<RedisReply>> exists =
      Run(c, cmds, options_.timeout);
  if (!exists.ok()) return exists.status();
  const uint64_t stored = StoredBlockBytes(payload_bytes_);
  std::vector<std::string> values;
  std::vector<size_t> which;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (KindOf(*(*exists)[i]) == ReplyKind::kInteger &&
        IntegerOf(*(*exists)[i]) > 0) {
      continue;  // another replica stored it
    }
    const StoreItem& it = batch[i];
    std::string v(stored, '\0');
    auto* out = reinterpret_cast<uint8_t*>(v.data());
    std::memcpy(out + kHeaderBytes, it.payload.data(), it.payload.size());
    if (options_.cipher != nullptr) {
      if (!SealBlock(*options_.cipher, it.header,
                     absl::MakeSpan(out + kHeaderBytes, it.payload.size()),
                     out)) {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.errors;
        ++stats_.stores_dropped[static_cast<int>(DropReason::kError)];
        continue;
      }
    } else {
      const ConstPiece payload{it.payload.data(), it.payload.size()};
      EncodeHeader(it.header, absl::MakeConstSpan(&payload, 1), out);
    }
    values.push_back(std::move(v));
    which.push_back(i);
  }
  if (values.empty()) return 0;
  const std::string ttl = absl::StrCat(options_.ttl_seconds);
  cmds.clear();
  for (size_t j = 0; j < values.size(); ++j) {
    RedisCommand cmd = {"SET", keys[which[j]], values[j]};
    if (options_.ttl_seconds > 0) {
      cmd.emplace_back("EX");
      cmd.emplace_back(ttl);
    }
    cmds.push_back(std::move(cmd));
  }
  absl::StatusOr<std::vector<RedisReply>> set =
      c->Pipeline(cmds, options_.timeout * static_cast<int64_t>(values.size()));
  if (!set.ok()) return set.status();
  int written = 0;
  for (const RedisReply& r : *set) {
    if (KindOf(*r) == ReplyKind::kStatus) {
      ++written;
    } else {
      // OOM under maxmemory-policy noeviction, a read-only replica, ...
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.errors;
      ++stats_.stores_dropped[static_cast<int>(DropReason::kError)];
    }
  }
  return written;
}

void RemoteTier::RefreshSize(std::unique_ptr<RedisConnection>& c) {
  const std::vector<RedisCommand> cmds = {{"INFO", "memory"}, {"DBSIZE"}};
  absl::StatusOr<std::vector<RedisReply>> r = Run(c, cmds, options_.timeout);
  std::lock_guard<std::mutex> lock(mu_);
  sized_at_ = absl::Now();
  if (!r.ok()) return;
  const absl::string_view info = StringOf(*(*r)[0]);
  stats_.bytes = InfoField(info, "used_memory");
  stats_.capacity_bytes = InfoField(info, "maxmemory");
  stats_.blocks = static_cast<uint64_t>(std::max(0LL, IntegerOf(*(*r)[1])));
}

int64_t RemoteTier::Flush(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t dropped =
      DrainWriteQueue(lock, idle_, queue_, writing_, deadline);
  stats_.stores_dropped[static_cast<int>(DropReason::kQueueFull)] += dropped;
  return dropped;
}

absl::StatusOr<int64_t> RemoteTier::Purge(std::optional<uint64_t> scope_tag,
                                          std::optional<uint64_t> salt_tag) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> c,
                      Acquire(options_.timeout));
  const std::string pattern = absl::StrCat(
      prefix_, scope_tag ? absl::StrFormat("%016x", *scope_tag) : "*", ":",
      salt_tag ? absl::StrFormat("%016x", *salt_tag) : "*", ":*");
  int64_t removed = 0;
  std::string cursor = "0";
  do {
    const std::vector<RedisCommand> scan = {
        {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}};
    absl::StatusOr<std::vector<RedisReply>> r = Run(c, scan, options_.timeout);
    if (!r.ok()) {
      OnError(r.status());
      return r.status();
    }
    const redisReply& reply = *(*r)[0];
    if (KindOf(reply) != ReplyKind::kArray || ArraySize(reply) != 2) {
      return absl::InternalError("redis: unexpected SCAN reply");
    }
    cursor = std::string(StringOf(ArrayAt(reply, 0)));
    const redisReply& keys = ArrayAt(reply, 1);
    RedisCommand unlink = {"UNLINK"};
    for (size_t i = 0; i < ArraySize(keys); ++i) {
      unlink.push_back(StringOf(ArrayAt(keys, i)));
    }
    if (unlink.size() > 1) {
      const std::vector<RedisCommand> del = {unlink};
      absl::StatusOr<std::vector<RedisReply>> d =
          c->Pipeline(del, options_.timeout);
      if (!d.ok()) {
        OnError(d.status());
        return d.status();
      }
      removed += IntegerOf(*(*d)[0]);
    }
  } while (cursor != "0");
  Return(std::move(c));
  return removed;
}

TierStats RemoteTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  TierStats s = stats_;
  s.queued = queue_.size();
  return s;
}

}  // namespace kvserve::kvtier
