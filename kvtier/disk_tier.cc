#include "kvtier/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "spdlog/spdlog.h"

namespace kvserve::kvtier {
namespace {

constexpr absl::Duration kFirstBackoff = absl::Seconds(1);
constexpr absl::Duration kMaxBackoff = absl::Seconds(60);
constexpr absl::Duration kStaleTmp = absl::Hours(1);
constexpr int kMaxIov = 1024;
constexpr size_t kMaxTouched = 1 << 16;
constexpr auto kTouchDelay = std::chrono::seconds(1);

// Creates `path` 0700 if absent; an existing one must be a directory.
int MakeDir(const std::string& path) {
  if (mkdir(path.c_str(), 0700) == 0 || errno == EEXIST) return 0;
  return errno;
}

// The directory the operator named: created when missing, else it must be
// a real directory of this user that nobody else can write into.
absl::Status CheckRoot(const std::string& dir) {
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(
          absl::StrCat("--kv-disk-cache ", dir, ": ", std::strerror(errno)));
    }
    std::string prefix;
    for (absl::string_view part : absl::StrSplit(dir, '/')) {
      absl::StrAppend(&prefix, part, "/");
      if (part.empty()) continue;
      if (int err = MakeDir(prefix); err != 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("--kv-disk-cache ", dir, ": cannot create ", prefix,
                         ": ", std::strerror(err)));
      }
    }
    if (lstat(dir.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("--kv-disk-cache ", dir, ": ", std::strerror(errno)));
    }
  }
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--kv-disk-cache ", dir, ": not a directory (symlinks are refused)"));
  }
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--kv-disk-cache %s: owned by uid %d, not this user (uid %d); the "
        "cache holds prompts",
        dir, st.st_uid, geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--kv-disk-cache %s: writable by group or others (mode %o); the "
        "cache holds prompts: chmod go-w",
        dir, st.st_mode & 07777));
  }
  return absl::OkStatus();
}

using VectorIo = ssize_t (*)(int, const iovec*, int, off_t);

// Moves every byte of `iov` at `offset` with `io` (preadv or pwritev),
// resuming after short transfers; 0, errno, or -1 when `io` moves nothing
// (a read past the end of a short file).
int TransferAll(VectorIo io, int fd, std::vector<iovec> iov, off_t offset) {
  size_t i = 0;
  while (i < iov.size()) {
    const int n = static_cast<int>(std::min<size_t>(iov.size() - i, kMaxIov));
    const ssize_t done = io(fd, iov.data() + i, n, offset);
    if (done < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (done == 0) return -1;
    offset += done;
    size_t left = static_cast<size_t>(done);
    while (i < iov.size() && left >= iov[i].iov_len) {
      left -= iov[i].iov_len;
      ++i;
    }
    if (left > 0) {
      iov[i].iov_base = static_cast<char*>(iov[i].iov_base) + left;
      iov[i].iov_len -= left;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(
    const DiskTierOptions& options, Key salt, Key fingerprint,
    uint64_t payload_bytes) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("--kv-disk-cache: empty directory");
  }
  if (options.capacity_bytes < StoredBlockBytes(payload_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv-disk-cache-bytes %d is below one block (%d bytes)",
        options.capacity_bytes, StoredBlockBytes(payload_bytes)));
  }
  if (auto s = CheckRoot(options.dir); !s.ok()) return s;
  std::string root = absl::StrCat(options.dir, "/kvserve-v1");
  for (const std::string& d : {root, absl::StrCat(root, "/", Hex128(salt))}) {
    if (int err = MakeDir(d); err != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--kv-disk-cache: cannot create ", d, ": ", std::strerror(err)));
    }
  }
  absl::StrAppend(&root, "/", Hex128(salt));
  std::unique_ptr<DiskTier> tier(
      new DiskTier(options, salt, fingerprint, payload_bytes, root));
  if (auto s = tier->Scan(); !s.ok()) return s;
  tier->writer_ = std::thread([t = tier.get()] { t->WriterLoop(); });
  return tier;
}

DiskTier::DiskTier(const DiskTierOptions& options, Key salt, Key fingerprint,
                   uint64_t payload_bytes, std::string root)
    : options_(options),
      salt_(salt),
      fingerprint_(fingerprint),
      payload_bytes_(payload_bytes),
      root_(std::move(root)),
      index_(StoredBlockBytes(payload_bytes)) {
  stats_.capacity_bytes = options.capacity_bytes;
}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string DiskTier::PathOf(const BlockName& name) const {
  return absl::StrCat(root_, "/", BlockSubdir(name.key), "/",
                      BlockFileName(name));
}

absl::Status DiskTier::Scan() {
  const absl::Time t0 = absl::Now();
  struct Found {
    int64_t mtime_ns;
    BlockName name;
  };
  std::vector<Found> found;
  uint64_t stale = 0;
  const int64_t now_ns = absl::ToUnixNanos(absl::Now());
  for (int s = 0; s < 256; ++s) {
    const std::string sub = absl::StrFormat("%s/%02x", root_, s);
    DIR* d = opendir(sub.c_str());
    if (d == nullptr) continue;
    const int dfd = dirfd(d);
    while (dirent* e = readdir(d)) {
      const absl::string_view n = e->d_name;
      if (n == "." || n == "..") continue;
      struct stat st;
      if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      const int64_t mtime_ns =
          int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
      const std::optional<BlockName> name = ParseBlockFileName(n);
      if (!name.has_value()) {
        // A writer's temporary file left by a crash.
        if (absl::StartsWith(n, ".tmp.") &&
            now_ns - mtime_ns > absl::ToInt64Nanoseconds(kStaleTmp)) {
          unlinkat(dfd, e->d_name, 0);
          ++stale;
        }
        continue;
      }
      if (!S_ISREG(st.st_mode) ||
          static_cast<uint64_t>(st.st_size) != index_.entry_bytes()) {
        unlinkat(dfd, e->d_name, 0);  // torn or foreign: never a hit
        ++stale;
        continue;
      }
      found.push_back({mtime_ns, *name});
    }
    closedir(d);
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.mtime_ns < b.mtime_ns;
  });
  std::vector<BlockName> victims;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Found& f : found) index_.Insert(f.name);
    victims = index_.TakeVictims(options_.capacity_bytes);
    stats_.indexed_at_start = index_.size();
    stats_.evictions += victims.size();
    stats_.index_seconds = SecondsSince(t0);
  }
  for (const BlockName& v : victims) Unlink(v);
  spdlog::info(
      "kv disk tier {}: {} blocks ({:.1f} MiB of {:.1f} MiB) indexed in "
      "{:.3f} s; {} evicted over the limit, {} stale files removed",
      root_, stats_.indexed_at_start,
      stats_.indexed_at_start * index_.entry_bytes() / 1048576.0,
      options_.capacity_bytes / 1048576.0, stats_.index_seconds, victims.size(),
      stale);
  return absl::OkStatus();
}

void DiskTier::Unlink(const BlockName& name) { unlink(PathOf(name).c_str()); }

void DiskTier::RecordChanges() {
  std::lock_guard<std::mutex> lock(mu_);
  record_changes_ = true;
}

std::vector<TierChange> DiskTier::TakeChanges() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TierChange> out;
  out.swap(changes_);
  return out;
}

void DiskTier::LogRemoved(Key key) {
  if (!record_changes_) return;
  TierChange c;
  c.header.key = key;
  changes_.push_back(std::move(c));
}

void DiskTier::LogRemoved(const std::vector<BlockName>& names) {
  for (const BlockName& n : names) LogRemoved(n.key);
}

void DiskTier::CountMiss(MissReason r) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.misses[static_cast<int>(r)];
}

int64_t DiskTier::Probe(absl::Span<const Key> keys, uint64_t scope_tag,
                        uint64_t salt_tag) {
  int64_t n = 0;
  for (; n < static_cast<int64_t>(keys.size()); ++n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (index_.Contains(keys[n])) continue;
    }
    // Perhaps another daemon's: one stat.
    const BlockName name{keys[n], scope_tag, salt_tag};
    struct stat st;
    if (stat(PathOf(name).c_str(), &st) != 0 ||
        static_cast<uint64_t>(st.st_size) != index_.entry_bytes()) {
      break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    index_.Insert(name);
  }
  return n;
}

bool DiskTier::Contains(Key key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.Contains(key);
}

bool DiskTier::Store(StoreItem item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.Contains(item.header.key)) return true;
    if (absl::Now() < paused_until_) {
      ++stats_.stores_dropped[static_cast<int>(DropReason::kUnhealthy)];
      return false;
    }
    if (static_cast<int>(queue_.size()) >= options_.max_queued_blocks) {
      ++stats_.stores_dropped[static_cast<int>(DropReason::kQueueFull)];
      return false;
    }
    queue_.push_back(std::move(item));
  }
  wake_.notify_one();
  return true;
}

void DiskTier::WriterLoop() {
  // The lowest priority: on a machine whose cores the forward keeps busy,
  // writes take what the compute threads leave, not time from their steps
  // (a queue that then fills drops blocks, counted). Named for top -H and
  // the benchmarks that read its CPU time.
  pthread_setname_np(pthread_self(), "kv-tier-disk");
  setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), 19);
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    // Touches wait for a store or a second: never in a load's way.
    wake_.wait_for(lock, kTouchDelay, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    if (queue_.empty()) {
      if (touched_.empty()) continue;
      std::vector<BlockName> touched;
      touched.swap(touched_);
      lock.unlock();
      for (const BlockName& n : touched) {
        utimensat(AT_FDCWD, PathOf(n).c_str(), nullptr, 0);
      }
      lock.lock();
      continue;
    }
    StoreItem item = std::move(queue_.front());
    queue_.pop_front();
    if (index_.Contains(item.header.key)) {
      if (queue_.empty()) idle_.notify_all();
      continue;
    }
    writing_ = true;
    lock.unlock();
    const absl::Time t0 = absl::Now();
    const int err = WriteFile(item);
    if (err == 0 && options_.observe_store) {
      options_.observe_store(SecondsSince(t0));
    }
    lock.lock();
    writing_ = false;
    std::vector<BlockName> victims;
    if (err == 0) {
      index_.Insert({item.header.key, item.scope_tag, SaltTag(item.header.ns)});
      ++stats_.stores;
      if (record_changes_) changes_.push_back({true, item.header});
      victims = index_.TakeVictims(options_.capacity_bytes);
      stats_.evictions += victims.size();
      LogRemoved(victims);
    } else {
      ++stats_.stores_dropped[static_cast<int>(DropReason::kError)];
    }
    lock.unlock();
    if (err == 0) {
      OnWriteOk();
    } else {
      OnWriteError(err);
    }
    for (const BlockName& v : victims) Unlink(v);
    lock.lock();
    if (queue_.empty()) idle_.notify_all();
  }
}

int DiskTier::WriteFile(const StoreItem& item) {
  if (options_.inject_write_errno != 0) return options_.inject_write_errno;
  const BlockName name{item.header.key, item.scope_tag,
                       SaltTag(item.header.ns)};
  const std::string sub = absl::StrCat(root_, "/", BlockSubdir(name.key));
  uint64_t counter;
  {
    std::lock_guard<std::mutex> lock(mu_);
    counter = ++tmp_counter_;
  }
  const std::string tmp = absl::StrFormat("%s/.tmp.%s.%d.%d", sub,
                                          Hex128(name.key), getpid(), counter);
  constexpr int kFlags = O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC;
  int fd = open(tmp.c_str(), kFlags, 0600);
  if (fd < 0 && errno == ENOENT) {
    // The subdirectory (or the whole tree) is new or was removed.
    if (int err = MakeDir(options_.dir); err != 0) return err;
    if (int err = MakeDir(absl::StrCat(options_.dir, "/kvserve-v1")); err) {
      return err;
    }
    if (int err = MakeDir(root_); err != 0) return err;
    if (int err = MakeDir(sub); err != 0) return err;
    fd = open(tmp.c_str(), kFlags, 0600);
  }
  if (fd < 0) return errno;
  uint8_t header[kHeaderBytes];
  std::vector<uint8_t> sealed;
  if (options_.cipher != nullptr) {
    // The payload is shared with other tiers: sealed in a copy.
    sealed.assign(item.payload.begin(), item.payload.end());
    if (!SealBlock(*options_.cipher, item.header, absl::MakeSpan(sealed),
                   header)) {
      close(fd);
      unlink(tmp.c_str());
      return EIO;
    }
  }
  const absl::Span<const uint8_t> bytes =
      options_.cipher != nullptr ? absl::MakeConstSpan(sealed) : item.payload;
  if (options_.cipher == nullptr) {
    const ConstPiece payload{bytes.data(), bytes.size()};
    EncodeHeader(item.header, absl::MakeConstSpan(&payload, 1), header);
  }
  static const std::vector<uint8_t> kZeros(kFileAlign, 0);
  const size_t pad = index_.entry_bytes() - kHeaderBytes - bytes.size();
  std::vector<iovec> iov = {{header, kHeaderBytes},
                            {const_cast<uint8_t*>(bytes.data()), bytes.size()}};
  if (pad > 0) iov.push_back({const_cast<uint8_t*>(kZeros.data()), pad});
  int err = TransferAll(&pwritev, fd, std::move(iov), 0);
  if (err < 0) err = EIO;  // a write that moved nothing
  if (close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && rename(tmp.c_str(), PathOf(name).c_str()) != 0) err = errno;
  if (err != 0) unlink(tmp.c_str());
  return err;
}

void DiskTier::OnWriteError(int err) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.errors;
  const bool was_writable = stats_.healthy;
  backoff_ = backoff_ == absl::ZeroDuration()
                 ? kFirstBackoff
                 : std::min(backoff_ * 2, kMaxBackoff);
  paused_until_ = absl::Now() + backoff_;
  stats_.healthy = false;
  if (was_writable) {
    spdlog::warn(
        "kv disk tier {}: write failed ({}); blocks are dropped, not "
        "stored, and writes retried with backoff",
        root_, std::strerror(err));
  }
  // Queued blocks would meet the same fault.
  stats_.stores_dropped[static_cast<int>(DropReason::kUnhealthy)] +=
      queue_.size();
  queue_.clear();
}

void DiskTier::OnWriteOk() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stats_.healthy) {
    spdlog::info("kv disk tier {}: writes succeed again", root_);
  }
  stats_.healthy = true;
  backoff_ = absl::ZeroDuration();
}

std::optional<MissReason> DiskTier::Load(const Expected& expected,
                                         uint64_t scope_tag,
                                         absl::Span<const Piece> dst) {
  Expected want = expected;
  want.cipher = options_.cipher.get();
  const BlockName name{want.key, scope_tag, SaltTag(want.ns)};
  auto miss = [&](MissReason r, bool remove) {
    if (remove) Unlink(name);
    std::lock_guard<std::mutex> lock(mu_);
    if ((remove || r == MissReason::kAbsent) && index_.Erase(name.key)) {
      LogRemoved(name.key);
    }
    ++stats_.misses[static_cast<int>(r)];
    return std::optional<MissReason>(r);
  };
  if (options_.inject_read_errno != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;
    ++stats_.misses[static_cast<int>(MissReason::kUnavailable)];
    return MissReason::kUnavailable;
  }
  const int fd = open(PathOf(name).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    return miss(
        errno == ENOENT ? MissReason::kAbsent : MissReason::kUnavailable,
        false);
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { close(fd); }
  } closer{fd};
  // One read of the header and the payload, straight into `dst` (lent
  // memory: garbage there on a miss is never used). A torn file is short.
  uint8_t header[kHeaderBytes];
  std::vector<iovec> iov;
  iov.reserve(dst.size() + 1);
  iov.push_back({header, kHeaderBytes});
  uint64_t total = 0;
  for (const Piece& p : dst) {
    iov.push_back({p.data, p.bytes});
    total += p.bytes;
  }
  if (total != payload_bytes_) return miss(MissReason::kFingerprint, false);
  if (const int err = TransferAll(&preadv, fd, std::move(iov), 0); err != 0) {
    return miss(err < 0 ? MissReason::kChecksum : MissReason::kUnavailable,
                err < 0);
  }
  if (std::optional<MissReason> r =
          CheckHeader(header, index_.entry_bytes(), want)) {
    return miss(*r, true);
  }
  ChecksumCheck check(header);
  for (const Piece& p : dst) check.Add(p.data, p.bytes);
  if (!check.Matches()) return miss(MissReason::kChecksum, true);
  if (want.cipher != nullptr) {
    if (std::optional<MissReason> r =
            OpenBlock(*want.cipher, header, dst, want)) {
      return miss(*r, true);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!index_.Touch(name.key)) index_.Insert(name);
    ++stats_.hits;
    // The writer sets its mtime when it next runs (at most kTouchDelay).
    if (touched_.size() < kMaxTouched) touched_.push_back(name);
  }
  return std::nullopt;
}

int64_t DiskTier::Flush(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t dropped =
      DrainWriteQueue(lock, idle_, queue_, writing_, deadline);
  stats_.stores_dropped[static_cast<int>(DropReason::kQueueFull)] += dropped;
  return dropped;
}

int64_t DiskTier::Purge(std::optional<uint64_t> scope_tag,
                        std::optional<uint64_t> salt_tag) {
  auto match = [&](const BlockName& n) {
    return (!scope_tag || n.scope_tag == *scope_tag) &&
           (!salt_tag || n.salt_tag == *salt_tag);
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    LogRemoved(index_.TakeIf(match));
  }
  // By the names on disk: another daemon's files too.
  int64_t removed = 0;
  for (int s = 0; s < 256; ++s) {
    const std::string sub = absl::StrFormat("%s/%02x", root_, s);
    DIR* d = opendir(sub.c_str());
    if (d == nullptr) continue;
    while (dirent* e = readdir(d)) {
      const std::optional<BlockName> name = ParseBlockFileName(e->d_name);
      if (name && match(*name) && unlinkat(dirfd(d), e->d_name, 0) == 0) {
        ++removed;
      }
    }
    closedir(d);
  }
  return removed;
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DiskTierStats s = stats_;
  s.blocks = index_.size();
  s.bytes = index_.bytes();
  s.queued = queue_.size();
  s.healthy = s.healthy && absl::Now() >= paused_until_;
  return s;
}

}  // namespace kvserve::kvtier
