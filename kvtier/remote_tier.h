// The remote tier: KV blocks as values in a Redis/Valkey that several
// replicas share, so a prefix one computed is a hit on the others. Values
// are the disk tier's bytes (block_codec.h), verified the same way on
// load; keys name the model salt, the tenant scope and salt tags, and the
// block:
//
//   kvserve:v1:<salt>:<scope_tag>:<salt_tag>:<key>     (hex)
//
// Writes (write-through) run on a writer thread: a batch asks EXISTS and
// SETs only what the store lacks, a full queue drops the block, counted.
// Loads run on the loader's threads, a pipeline of GETs per chunk, each
// value verified before it counts; a bad value is a counted miss and is
// UNLINKed. Eviction is the store's (maxmemory-policy allkeys-lru) or a
// TTL: kvserve never scans it to enforce a size.
//
// Faults never reach a request: a store that is down, slow (a timeout) or
// refuses the credentials marks the tier unhealthy; loads miss as
// `unavailable` and stores drop as `unhealthy` while it backs off (0.1 s
// doubling to 30 s), logged once per change of state, and the next use
// after the backoff reconnects (and re-authenticates). Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/block_cipher.h"
#include "kvtier/redis_client.h"
#include "kvtier/tier.h"

namespace kvserve::kvtier {

struct RemoteTierOptions {
  RedisTarget target;
  RedisAuth auth;
  // Bound on one connect or one pipeline's round trip (loads also stop at
  // their own deadline).
  absl::Duration timeout = absl::Milliseconds(500);
  int max_queued_blocks = 64;
  int64_t ttl_seconds = 0;  // 0: none; the store's eviction policy rules
  std::function<void(double)> observe_store;  // writer thread, per block
  // Non-null: values are sealed (block_cipher.h) and only sealed ones read.
  std::shared_ptr<const BlockCipher> cipher;
};

class RemoteTier {
 public:
  // InvalidArgument without a password (the store holds prompts). A store
  // that is down now is not an error: the tier starts unhealthy.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RemoteTier>> Open(
      const RemoteTierOptions& options, Key salt, uint64_t payload_bytes);
  ~RemoteTier();
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // Loads `blocks` (a chain, in order) of namespace `ns`; returns how many
  // verified from the first and why it stopped short, if it did. Misses
  // are counted here but for kDeadline, which the deadline's owner counts.
  [[nodiscard]] std::pair<int32_t, std::optional<MissReason>> LoadRun(
      absl::Span<const LoadBlock> blocks, Key ns, uint64_t scope_tag,
      absl::Time deadline);
  // Queues a block; false (counted) when the queue is full or the tier
  // backs off.
  bool Store(StoreItem item);
  // Waits for the queue to drain, up to `deadline`; returns the blocks
  // dropped.
  int64_t Flush(absl::Time deadline);
  // Deletes this model's blocks whose tags match (nullopt: any); returns
  // how many, or the store's error.
  [[nodiscard]] absl::StatusOr<int64_t> Purge(std::optional<uint64_t> scope_tag,
                                              std::optional<uint64_t> salt_tag);

  // False while backing off after an error.
  [[nodiscard]] bool healthy() const;
  // bytes / capacity_bytes / blocks are the whole store's (INFO memory,
  // DBSIZE), refreshed by the writer every few seconds.
  [[nodiscard]] TierStats stats() const;
  [[nodiscard]] std::string Describe() const;
  [[nodiscard]] std::string KeyOf(Key key, uint64_t scope_tag,
                                  uint64_t salt_tag) const;

 private:
  RemoteTier(const RemoteTierOptions& options, Key salt,
             uint64_t payload_bytes);

  // A connection from the idle set or a new one (connecting within
  // `timeout`); Unavailable while the tier backs off.
  absl::StatusOr<std::unique_ptr<RedisConnection>> Acquire(
      absl::Duration timeout);
  // Runs a pipeline on *c; a connection that breaks before a reply is
  // replaced and the pipeline (idempotent) run once more: the store may
  // have restarted since the connection was last used.
  absl::StatusOr<std::vector<RedisReply>> Run(
      std::unique_ptr<RedisConnection>& c,
      absl::Span<const RedisCommand> commands, absl::Duration timeout);
  void Return(std::unique_ptr<RedisConnection> c);
  void OnError(const absl::Status& s);
  void OnOk();
  void CountMiss(MissReason r, uint64_t n = 1);
  // Verifies one GET reply against `b` and copies its payload into b.dst.
  std::optional<MissReason> Verify(const redisReply& r, const LoadBlock& b,
                                   Key ns) const;
  void WriterLoop();
  // Writes a batch: EXISTS, then SET what is missing. Returns the blocks
  // written or the failure.
  absl::StatusOr<int> WriteBatch(std::unique_ptr<RedisConnection>& c,
                                 const std::vector<StoreItem>& batch);
  void RefreshSize(std::unique_ptr<RedisConnection>& c);

  const RemoteTierOptions options_;
  const Key salt_;
  const uint64_t payload_bytes_;
  const std::string prefix_;  // kvserve:v1:<salt>:

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::vector<std::unique_ptr<RedisConnection>> idle_conns_;
  std::deque<StoreItem> queue_;
  bool writing_ = false;
  bool stop_ = false;
  absl::Time paused_until_ = absl::InfinitePast();
  absl::Duration backoff_ = absl::ZeroDuration();
  absl::Time sized_at_ = absl::InfinitePast();
  TierStats stats_;
  std::thread writer_;
};

}  // namespace kvserve::kvtier
