// The disk tier against a real directory: write-through and verified loads,
// restart indexing, the byte limit, corrupt, torn and foreign files, two
// tiers sharing a directory, injected write faults, a vanished directory,
// directory checks and purges.
#include "kvtier/disk_tier.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kvserve::kvtier {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kPayload = 5000;  // stored as 4096 + 8192
constexpr uint64_t kStored = 4096 + 8192;

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "kvtier_XXXXXX").string();
    path_ = mkdtemp(t.data()) != nullptr ? t : "";
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const Key kSalt = absl::MakeUint128(0x5a17, 1);
const Key kNs = absl::MakeUint128(0x1111, 0x2222);

struct Block {
  Key key;
  Key parent;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;
};

Block MakeBlock(int i) {
  Block b;
  b.key = absl::MakeUint128(static_cast<uint64_t>(i) << 56 | 7, i);
  b.parent = i == 0 ? 0 : absl::MakeUint128(i - 1, i - 1);
  b.tokens = {i, i + 1, i + 2, i + 3};
  b.payload.resize(kPayload);
  for (size_t j = 0; j < kPayload; ++j) {
    b.payload[j] = static_cast<uint8_t>(j * 31 + i);
  }
  return b;
}

StoreItem Item(const Block& b, uint64_t scope_tag = 0) {
  StoreItem it;
  it.header.salt = kSalt;
  it.header.key = b.key;
  it.header.parent = b.parent;
  it.header.ns = kNs;
  it.header.payload_bytes = kPayload;
  it.header.tokens = b.tokens;
  it.scope_tag = scope_tag;
  auto bytes = std::make_shared<const std::vector<uint8_t>>(b.payload);
  it.payload = absl::MakeConstSpan(*bytes);
  it.owner = std::move(bytes);
  return it;
}

Expected Want(const Block& b) {
  return {kSalt, b.key, b.parent, kNs, b.tokens, kPayload};
}

std::unique_ptr<DiskTier> OpenTier(const std::string& dir,
                                   uint64_t capacity = 100 * kStored,
                                   int write_errno = 0) {
  DiskTierOptions o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  o.inject_write_errno = write_errno;
  absl::StatusOr<std::unique_ptr<DiskTier>> t =
      DiskTier::Open(o, kSalt, absl::MakeUint128(3, 4), kPayload);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// Loads `b` split into two pieces; nullopt on a hit with equal bytes.
std::optional<MissReason> LoadInto(DiskTier& t, const Block& b,
                                   uint64_t scope_tag = 0) {
  std::vector<uint8_t> out(kPayload, 0xee);
  const Piece pieces[2] = {{out.data(), 1234},
                           {out.data() + 1234, kPayload - 1234}};
  std::optional<MissReason> r = t.Load(Want(b), scope_tag, pieces);
  if (!r.has_value()) EXPECT_EQ(out, b.payload);
  return r;
}

std::string FileOf(const DiskTier& t, const Block& b, uint64_t scope = 0) {
  return t.root() + "/" + BlockSubdir(b.key) + "/" +
         BlockFileName({b.key, scope, SaltTag(kNs)});
}

void Flush(DiskTier& t) { t.Flush(absl::Now() + absl::Seconds(10)); }

TEST(DiskTierTest, StoresLoadsAndSurvivesRestart) {
  TempDir dir;
  std::vector<Block> blocks = {MakeBlock(0), MakeBlock(1), MakeBlock(2)};
  {
    std::unique_ptr<DiskTier> t = OpenTier(dir.path());
    for (const Block& b : blocks) EXPECT_TRUE(t->Store(Item(b)));
    Flush(*t);
    const DiskTierStats s = t->stats();
    EXPECT_EQ(s.stores, 3u);
    EXPECT_EQ(s.blocks, 3u);
    EXPECT_EQ(s.bytes, 3 * kStored);
    for (const Block& b : blocks) EXPECT_EQ(LoadInto(*t, b), std::nullopt);
    struct stat st;
    ASSERT_EQ(stat(FileOf(*t, blocks[0]).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), kStored);
    ASSERT_EQ(stat(t->root().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
  }
  std::unique_ptr<DiskTier> t = OpenTier(dir.path());
  EXPECT_EQ(t->stats().indexed_at_start, 3u);
  const Key keys[4] = {blocks[0].key, blocks[1].key, blocks[2].key,
                       absl::MakeUint128(99, 99)};
  EXPECT_EQ(t->Probe(keys, 0, SaltTag(kNs)), 3);
  for (const Block& b : blocks) EXPECT_EQ(LoadInto(*t, b), std::nullopt);
  EXPECT_EQ(t->stats().hits, 3u);
}

TEST(DiskTierTest, ByteLimitEvictsLeastRecentlyUsed) {
  TempDir dir;
  std::unique_ptr<DiskTier> t = OpenTier(dir.path(), 2 * kStored);
  const Block a = MakeBlock(0), b = MakeBlock(1), c = MakeBlock(2);
  t->Store(Item(a));
  t->Store(Item(b));
  Flush(*t);
  EXPECT_EQ(LoadInto(*t, a), std::nullopt);  // a is now the most recent
  t->Store(Item(c));
  Flush(*t);
  const DiskTierStats s = t->stats();
  EXPECT_EQ(s.blocks, 2u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_FALSE(fs::exists(FileOf(*t, b)));
  EXPECT_EQ(LoadInto(*t, b), MissReason::kAbsent);
  EXPECT_EQ(LoadInto(*t, a), std::nullopt);
  EXPECT_EQ(LoadInto(*t, c), std::nullopt);
}

void FlipByte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x10));
}

TEST(DiskTierTest, CorruptWrongAndForeignFilesAreMissesThatDelete) {
  TempDir dir;
  std::unique_ptr<DiskTier> t = OpenTier(dir.path());
  const Block a = MakeBlock(0), b = MakeBlock(1), c = MakeBlock(2);
  t->Store(Item(a));
  t->Store(Item(b));
  t->Store(Item(c));
  Flush(*t);
  FlipByte(FileOf(*t, a), 4096 + 4000);  // payload
  EXPECT_EQ(LoadInto(*t, a), MissReason::kChecksum);
  EXPECT_FALSE(fs::exists(FileOf(*t, a)));
  Block wrong = b;
  wrong.tokens[2] = 42;  // a request whose tokens differ under the same key
  EXPECT_EQ(LoadInto(*t, wrong), MissReason::kTokens);
  EXPECT_FALSE(fs::exists(FileOf(*t, b)));
  FlipByte(FileOf(*t, c), 20);  // the salt: another model's block
  EXPECT_EQ(LoadInto(*t, c), MissReason::kFingerprint);
  const DiskTierStats s = t->stats();
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.misses[static_cast<int>(MissReason::kChecksum)], 1u);
  EXPECT_EQ(s.misses[static_cast<int>(MissReason::kTokens)], 1u);
  EXPECT_EQ(s.misses[static_cast<int>(MissReason::kFingerprint)], 1u);
  EXPECT_EQ(s.blocks, 0u);
}

TEST(DiskTierTest, TornAndStaleFilesAreRemovedAtStart) {
  TempDir dir;
  const Block a = MakeBlock(0), b = MakeBlock(1);
  std::string torn, root;
  {
    std::unique_ptr<DiskTier> t = OpenTier(dir.path());
    t->Store(Item(a));
    t->Store(Item(b));
    Flush(*t);
    torn = FileOf(*t, a);
    root = t->root();
  }
  fs::resize_file(torn, kStored - 100);
  const std::string tmp = root + "/00/.tmp.dead.1.1";
  std::ofstream(tmp) << "partial";
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(2);
  fs::last_write_time(tmp, old);
  std::unique_ptr<DiskTier> t = OpenTier(dir.path());
  EXPECT_EQ(t->stats().indexed_at_start, 1u);
  EXPECT_FALSE(fs::exists(torn));
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(LoadInto(*t, b), std::nullopt);
}

TEST(DiskTierTest, TwoTiersShareOneDirectory) {
  TempDir dir;
  std::unique_ptr<DiskTier> one = OpenTier(dir.path());
  std::unique_ptr<DiskTier> two = OpenTier(dir.path());
  const Block a = MakeBlock(0), b = MakeBlock(1);
  one->Store(Item(a));
  two->Store(Item(b));
  two->Store(Item(a));  // both write a: renames of equal bytes
  Flush(*one);
  Flush(*two);
  const Key keys[2] = {a.key, b.key};
  EXPECT_EQ(one->Probe(keys, 0, SaltTag(kNs)), 2);
  EXPECT_EQ(two->Probe(keys, 0, SaltTag(kNs)), 2);
  EXPECT_EQ(LoadInto(*one, b), std::nullopt);
  EXPECT_EQ(LoadInto(*two, a), std::nullopt);
  // A file the other removed is an absent miss.
  fs::remove(FileOf(*one, a));
  EXPECT_EQ(LoadInto(*two, a), MissReason::kAbsent);
}

TEST(DiskTierTest, WriteFaultsDropAndBackOff) {
  TempDir dir;
  std::unique_ptr<DiskTier> t =
      OpenTier(dir.path(), 100 * kStored, /*write_errno=*/ENOSPC);
  EXPECT_TRUE(t->Store(Item(MakeBlock(0))));
  Flush(*t);
  DiskTierStats s = t->stats();
  EXPECT_EQ(s.stores, 0u);
  EXPECT_EQ(s.errors, 1u);
  EXPECT_EQ(s.stores_dropped[static_cast<int>(DropReason::kError)], 1u);
  EXPECT_FALSE(s.healthy);
  // Paused: refused at once, counted, never queued.
  EXPECT_FALSE(t->Store(Item(MakeBlock(1))));
  s = t->stats();
  EXPECT_EQ(s.stores_dropped[static_cast<int>(DropReason::kUnhealthy)], 1u);
  EXPECT_EQ(s.queued, 0u);
}

TEST(DiskTierTest, VanishedDirectoryIsRecreated) {
  TempDir dir;
  std::unique_ptr<DiskTier> t = OpenTier(dir.path());
  const Block a = MakeBlock(0), b = MakeBlock(1);
  t->Store(Item(a));
  Flush(*t);
  fs::remove_all(dir.path());
  EXPECT_EQ(LoadInto(*t, a), MissReason::kAbsent);
  t->Store(Item(b));
  Flush(*t);
  EXPECT_EQ(t->stats().stores, 2u);
  EXPECT_EQ(LoadInto(*t, b), std::nullopt);
  struct stat st;
  ASSERT_EQ(stat(dir.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(DiskTierTest, RefusesUnsafeDirectories) {
  TempDir dir;
  const std::string open_dir = dir.path() + "/open";
  fs::create_directory(open_dir);
  fs::permissions(open_dir, fs::perms::all);
  DiskTierOptions o;
  o.dir = open_dir;
  o.capacity_bytes = 10 * kStored;
  absl::StatusOr<std::unique_ptr<DiskTier>> t =
      DiskTier::Open(o, kSalt, 0, kPayload);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(t.status().message().find("writable by group or others"),
            std::string::npos);
  o.dir = dir.path() + "/link";
  fs::create_directory_symlink(dir.path(), o.dir);
  t = DiskTier::Open(o, kSalt, 0, kPayload);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  o.dir = dir.path() + "/fresh/nested";
  o.capacity_bytes = 10;
  t = DiskTier::Open(o, kSalt, 0, kPayload);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  o.capacity_bytes = kStored;
  t = DiskTier::Open(o, kSalt, 0, kPayload);
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST(DiskTierTest, PurgeByScopeTag) {
  TempDir dir;
  std::unique_ptr<DiskTier> t = OpenTier(dir.path());
  const Block a = MakeBlock(0), b = MakeBlock(1);
  t->Store(Item(a, /*scope_tag=*/1));
  t->Store(Item(b, /*scope_tag=*/2));
  Flush(*t);
  EXPECT_EQ(t->Purge(1, std::nullopt), 1);
  EXPECT_EQ(LoadInto(*t, a, 1), MissReason::kAbsent);
  EXPECT_EQ(LoadInto(*t, b, 2), std::nullopt);
  EXPECT_EQ(t->Purge(std::nullopt, std::nullopt), 1);
  EXPECT_EQ(t->stats().blocks, 0u);
}

// What KV events announce as STORAGE: the blocks written (with their
// headers) and every key that left the index, once asked, in order.
TEST(DiskTierTest, LogsResidencyChangesOnceAsked) {
  TempDir dir;
  std::unique_ptr<DiskTier> t = OpenTier(dir.path(), 2 * kStored);
  const Block a = MakeBlock(0), b = MakeBlock(1), c = MakeBlock(2);
  t->Store(Item(a));
  Flush(*t);
  EXPECT_TRUE(t->TakeChanges().empty());  // not asked yet
  t->RecordChanges();
  t->Store(Item(b));
  t->Store(Item(c));  // over the limit: a, the least recent, goes
  Flush(*t);
  std::vector<TierChange> log = t->TakeChanges();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_TRUE(log[0].stored);
  EXPECT_EQ(log[0].header.key, b.key);
  EXPECT_EQ(log[0].header.parent, b.parent);
  EXPECT_EQ(log[0].header.tokens, b.tokens);
  EXPECT_TRUE(log[1].stored);
  EXPECT_EQ(log[1].header.key, c.key);
  EXPECT_FALSE(log[2].stored);
  EXPECT_EQ(log[2].header.key, a.key);
  EXPECT_TRUE(t->TakeChanges().empty());
  FlipByte(FileOf(*t, b), 4096 + 4000);  // a corrupt file is deleted
  EXPECT_EQ(LoadInto(*t, b), MissReason::kChecksum);
  EXPECT_EQ(t->Purge(std::nullopt, std::nullopt), 1);  // c
  log = t->TakeChanges();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_FALSE(log[0].stored);
  EXPECT_EQ(log[0].header.key, b.key);
  EXPECT_FALSE(log[1].stored);
  EXPECT_EQ(log[1].header.key, c.key);
}

}  // namespace
}  // namespace kvserve::kvtier
