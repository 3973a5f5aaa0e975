// The disk tier: KV blocks as files under one directory, written through
// by a writer thread from copies the engine hands it, read and verified by
// whichever thread loads them, indexed in memory and bounded by bytes
// (LRU, disk_index.h). The files outlive the process: a restarted daemon
// indexes the directory (names and one stat per file) and serves them.
//
// Layout: DIR/kvserve-v1/<salt>/<key[0:2]>/<block file> (block_key.h,
// block_codec.h), directories 0700, files 0600. DIR must be a directory
// owned by this user and writable by no one else: the files hold prompts.
//
// Two daemons may share DIR: writes are a private temporary file renamed
// into place; a daemon finds the other's files when a probe misses its
// index (one stat), and a file removed under it is an `absent` miss.
//
// Faults never reach a request: a write that fails (disk full, read-only,
// vanished directory) drops the block, counts it and pauses writes with a
// backoff (1 s doubling to 60 s), logged once per change of state; a read
// that fails is a miss. Thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtier/block_cipher.h"
#include "kvtier/block_codec.h"
#include "kvtier/disk_index.h"
#include "kvtier/tier.h"

namespace kvserve::kvtier {

struct DiskTierOptions {
  std::string dir;
  uint64_t capacity_bytes = 0;
  int max_queued_blocks = 64;
  // Fault injection (tests, the hidden --kv-tier-inject-faults): every write
  // or read fails with this errno; 0 for none.
  int inject_write_errno = 0;
  int inject_read_errno = 0;
  // Called on the writer thread with each written block's seconds.
  std::function<void(double)> observe_store;
  // Non-null: blocks are sealed (block_cipher.h) and only sealed ones read.
  std::shared_ptr<const BlockCipher> cipher;
};

using DiskTierStats = TierStats;

class DiskTier {
 public:
  // Checks and indexes `options.dir` for blocks of `salt`. FailedPrecondition
  // naming the directory when it is not one, is a symlink, belongs to
  // another user or is writable by others; InvalidArgument for a zero
  // capacity or a capacity below one block.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DiskTier>> Open(
      const DiskTierOptions& options, Key salt, Key fingerprint,
      uint64_t payload_bytes);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // How many of `keys` (a chain, first block first) the tier holds in a
  // run from the first: the index, then one stat per block another daemon
  // may have written.
  [[nodiscard]] int64_t Probe(absl::Span<const Key> keys, uint64_t scope_tag,
                              uint64_t salt_tag);
  // Whether the index holds `key` (no file access).
  [[nodiscard]] bool Contains(Key key) const;
  // Queues a block for writing; false (counted) when the queue is full or
  // writes are paused. A key already held is skipped (true).
  bool Store(StoreItem item);
  // Reads the block `want` names into `dst` (pieces summing to the payload
  // size) and verifies it; nullopt on a hit. On a miss `dst` holds garbage;
  // content failures delete the file.
  [[nodiscard]] std::optional<MissReason> Load(const Expected& want,
                                               uint64_t scope_tag,
                                               absl::Span<const Piece> dst);
  // Waits for the queue to drain, up to `deadline`; what is still queued
  // then is dropped. Returns the blocks dropped.
  int64_t Flush(absl::Time deadline);
  // Deletes every block whose tags match (nullopt matches all); returns how
  // many.
  int64_t Purge(std::optional<uint64_t> scope_tag,
                std::optional<uint64_t> salt_tag);

  // From now on, keeps a log of residency changes for TakeChanges: blocks
  // this process wrote, and keys that left the index (evicted, purged,
  // found corrupt or gone). Files indexed at start or written by another
  // daemon are never logged as stored (their tokens are in the files only).
  void RecordChanges();
  [[nodiscard]] std::vector<TierChange> TakeChanges();

  [[nodiscard]] DiskTierStats stats() const;
  [[nodiscard]] const std::string& root() const { return root_; }
  [[nodiscard]] uint64_t stored_block_bytes() const {
    return index_.entry_bytes();
  }
  [[nodiscard]] uint64_t payload_bytes() const { return payload_bytes_; }

 private:
  DiskTier(const DiskTierOptions& options, Key salt, Key fingerprint,
           uint64_t payload_bytes, std::string root);

  absl::Status Scan();
  void WriterLoop();
  // Writes one block file; 0 or the errno of the failing call.
  int WriteFile(const StoreItem& item);
  void OnWriteError(int err);
  void OnWriteOk();
  void Unlink(const BlockName& name);
  // Under mu_: logs the keys that left the index.
  void LogRemoved(const std::vector<BlockName>& names);
  void LogRemoved(Key key);
  std::string PathOf(const BlockName& name) const;
  void CountMiss(MissReason r);

  const DiskTierOptions options_;
  const Key salt_;
  const Key fingerprint_;
  const uint64_t payload_bytes_;
  const std::string root_;  // DIR/kvserve-v1/<salt>

  mutable std::mutex mu_;
  std::condition_variable wake_;  // the writer: work or stop
  std::condition_variable idle_;  // Flush: the queue drained
  DiskIndex index_;
  std::deque<StoreItem> queue_;
  // Blocks loaded since the writer last ran: it sets their mtimes, so the
  // LRU order survives a restart without a metadata write on the load path.
  std::vector<BlockName> touched_;
  bool writing_ = false;
  bool stop_ = false;
  absl::Time paused_until_ = absl::InfinitePast();
  absl::Duration backoff_ = absl::ZeroDuration();
  DiskTierStats stats_;
  bool record_changes_ = false;
  std::vector<TierChange> changes_;
  uint64_t tmp_counter_ = 0;
  std::thread writer_;
};

}  // namespace kvserve::kvtier
