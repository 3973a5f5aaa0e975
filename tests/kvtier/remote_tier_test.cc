// The remote tier against a real redis-server (deploy/setup.sh --test
// installs it; each test starts its own on a free port, with a password):
// write-through and verified loads, misses by reason with bad values
// deleted, authentication, a store that goes down and comes back empty,
// a slow store, purges, and the URL's checks.
#include "kvtier/remote_tier.h"

#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace kvserve::kvtier {
namespace {

constexpr uint64_t kPayload = 5000;
constexpr char kPassword[] = "test-password-1";
const Key kSalt = absl::MakeUint128(0x5a17, 1);
const Key kNs = absl::MakeUint128(0x1111, 0x2222);

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A redis-server child process on `port`, killed on destruction.
class RedisServer {
 public:
  explicit RedisServer(int port) : port_(port) { Start(); }
  ~RedisServer() { Stop(); }
  void Start() {
    const std::string p = absl::StrCat(port_);
    std::vector<std::string> args = {"redis-server",
                                     "--port",
                                     p,
                                     "--bind",
                                     "127.0.0.1",
                                     "--requirepass",
                                     kPassword,
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--loglevel",
                                     "warning",
                                     "--logfile",
                                     "/dev/null",
                                     "--enable-debug-command",
                                     "local"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawnp(&pid_, "redis-server", nullptr, nullptr, argv.data(),
                           environ),
              0)
        << "redis-server not found: deploy/setup.sh --test installs it";
    for (int i = 0; i < 200; ++i) {
      if (RedisConnection::Connect({"127.0.0.1", port_, 0}, {"", kPassword},
                                   absl::Seconds(1))
              .ok()) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    FAIL() << "redis-server did not start on port " << port_;
  }
  void Stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  int port() const { return port_; }
  // A connection for the test's own commands.
  std::unique_ptr<RedisConnection> Client() const {
    return *RedisConnection::Connect({"127.0.0.1", port_, 0}, {"", kPassword},
                                     absl::Seconds(1));
  }

 private:
  int port_;
  pid_t pid_ = 0;
};

struct Block {
  Key key, parent;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;
};

Block MakeBlock(int i) {
  Block b;
  b.key = absl::MakeUint128(static_cast<uint64_t>(i) << 56 | 7, i);
  b.parent = i == 0 ? 0 : absl::MakeUint128((i - 1ull) << 56 | 7, i - 1);
  b.tokens = {i, i + 1, i + 2, i + 3};
  b.payload.resize(kPayload);
  for (size_t j = 0; j < kPayload; ++j) {
    b.payload[j] = static_cast<uint8_t>(j * 31 + i);
  }
  return b;
}

StoreItem Item(const Block& b, uint64_t scope_tag = 5) {
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

// Load blocks for `blocks`, their payloads landing in `out`.
std::vector<LoadBlock> Loads(const std::vector<Block>& blocks,
                             std::vector<std::vector<uint8_t>>* out) {
  out->assign(blocks.size(), std::vector<uint8_t>(kPayload));
  std::vector<LoadBlock> l;
  for (size_t i = 0; i < blocks.size(); ++i) {
    LoadBlock b;
    b.key = blocks[i].key;
    b.parent = blocks[i].parent;
    b.tokens = blocks[i].tokens;
    // Two pieces, as a pool's layer slabs would be.
    b.dst = {{(*out)[i].data(), 1000}, {(*out)[i].data() + 1000, 4000}};
    b.remote = true;
    l.push_back(std::move(b));
  }
  return l;
}

std::unique_ptr<RemoteTier> OpenTier(int port,
                                     const std::string& password = kPassword) {
  RemoteTierOptions o;
  o.target = {"127.0.0.1", port, 0};
  o.auth = {"", password};
  o.timeout = absl::Milliseconds(300);
  return *RemoteTier::Open(o, kSalt, kPayload);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

class RemoteTierTest : public ::testing::Test {
 protected:
  RemoteTierTest() : server_(FreePort()) {
    for (int i = 0; i < 20; ++i) blocks_.push_back(MakeBlock(i));
  }
  RedisServer server_;
  std::vector<Block> blocks_;
};

TEST_F(RemoteTierTest, StoresAndLoadsVerifiedChains) {
  auto t = OpenTier(server_.port());
  EXPECT_TRUE(t->healthy());
  for (const Block& b : blocks_) ASSERT_TRUE(t->Store(Item(b)));
  EXPECT_EQ(t->Flush(Soon()), 0);
  EXPECT_EQ(t->stats().stores, blocks_.size());
  // A second tier (another replica) reads what the first wrote, in chunks.
  auto other = OpenTier(server_.port());
  std::vector<std::vector<uint8_t>> out;
  const auto [n, miss] = other->LoadRun(Loads(blocks_, &out), kNs, 5, Soon());
  EXPECT_EQ(n, 20);
  EXPECT_FALSE(miss.has_value());
  for (size_t i = 0; i < blocks_.size(); ++i) {
    EXPECT_EQ(out[i], blocks_[i].payload);
  }
  EXPECT_EQ(other->stats().hits, 20u);
  // Stored again (another replica computed the same prefix): not re-sent.
  for (const Block& b : blocks_) ASSERT_TRUE(other->Store(Item(b)));
  other->Flush(Soon());
  EXPECT_EQ(other->stats().stores, 0u);
}

TEST_F(RemoteTierTest, EveryMismatchIsACountedMissAndDeletesTheValue) {
  auto t = OpenTier(server_.port());
  for (const Block& b : blocks_) t->Store(Item(b));
  t->Flush(Soon());
  std::vector<std::vector<uint8_t>> out;
  // Another scope: a different key, absent.
  auto r = t->LoadRun(Loads({blocks_[0]}, &out), kNs, 6, Soon());
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.second, MissReason::kAbsent);
  // Other tokens under the same key: never a hit, and deleted.
  std::vector<Block> wrong = {blocks_[0]};
  wrong[0].tokens[2] = 99;
  r = t->LoadRun(Loads(wrong, &out), kNs, 5, Soon());
  EXPECT_EQ(r.second, MissReason::kTokens);
  r = t->LoadRun(Loads({blocks_[0]}, &out), kNs, 5, Soon());
  EXPECT_EQ(r.second, MissReason::kAbsent);
  // A flipped payload byte: checksum, deleted.
  auto c = server_.Client();
  const std::string key = t->KeyOf(blocks_[1].key, 5, SaltTag(kNs));
  auto got = c->Pipeline({{"GET", key}}, absl::Seconds(1));
  ASSERT_TRUE(got.ok());
  std::string v(StringOf(*(*got)[0]));
  v[4096 + 10] ^= 1;
  ASSERT_TRUE(c->Pipeline({{"SET", key, v}}, absl::Seconds(1)).ok());
  r = t->LoadRun(Loads({blocks_[1]}, &out), kNs, 5, Soon());
  EXPECT_EQ(r.second, MissReason::kChecksum);
  auto exists = c->Pipeline({{"EXISTS", key}}, absl::Seconds(1));
  EXPECT_EQ(IntegerOf(*(*exists)[0]), 0);
  // Truncated, and a value of another model's salt.
  const std::string k2 = t->KeyOf(blocks_[2].key, 5, SaltTag(kNs));
  ASSERT_TRUE(
      c->Pipeline({{"SETRANGE", k2, "0", "XXXXXXXX"}}, absl::Seconds(1)).ok());
  r = t->LoadRun(Loads({blocks_[2]}, &out), kNs, 5, Soon());
  EXPECT_EQ(r.second, MissReason::kFingerprint);
  const std::string k3 = t->KeyOf(blocks_[3].key, 5, SaltTag(kNs));
  ASSERT_TRUE(c->Pipeline({{"SET", k3, "short"}}, absl::Seconds(1)).ok());
  r = t->LoadRun(Loads({blocks_[3]}, &out), kNs, 5, Soon());
  EXPECT_EQ(r.second, MissReason::kChecksum);
  // A chain stops at its first miss: blocks 4.. are fine, 3 is gone.
  r = t->LoadRun(Loads({blocks_[4], blocks_[5], blocks_[3], blocks_[6]}, &out),
                 kNs, 5, Soon());
  EXPECT_EQ(r.first, 2);
  EXPECT_EQ(r.second, MissReason::kAbsent);
  const TierStats s = t->stats();
  EXPECT_EQ(s.misses[static_cast<int>(MissReason::kTokens)], 1u);
  EXPECT_EQ(s.misses[static_cast<int>(MissReason::kChecksum)], 2u);
  EXPECT_EQ(s.misses[static_cast<int>(MissReason::kFingerprint)], 1u);
  EXPECT_EQ(s.misses[static_cast<int>(MissReason::kAbsent)], 3u);
}

TEST_F(RemoteTierTest, NeedsAPasswordAndSaysWhenItIsWrong) {
  RemoteTierOptions o;
  o.target = {"127.0.0.1", server_.port(), 0};
  EXPECT_EQ(RemoteTier::Open(o, kSalt, kPayload).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto bad =
      RedisConnection::Connect(o.target, {"", "wrong"}, absl::Seconds(1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kPermissionDenied);
  // A tier with the wrong password serves nothing, fails nothing.
  auto t = OpenTier(server_.port(), "wrong");
  EXPECT_FALSE(t->stats().healthy);
  std::vector<std::vector<uint8_t>> out;
  auto r = t->LoadRun(Loads({blocks_[0]}, &out), kNs, 5, Soon());
  EXPECT_EQ(r.second, MissReason::kUnavailable);
  EXPECT_FALSE(t->Store(Item(blocks_[0])));
}

TEST_F(RemoteTierTest, AStoreThatGoesDownAndComesBackEmpty) {
  auto t = OpenTier(server_.port());
  for (const Block& b : blocks_) t->Store(Item(b));
  t->Flush(Soon());
  server_.Stop();
  std::vector<std::vector<uint8_t>> out;
  auto r = t->LoadRun(Loads(blocks_, &out), kNs, 5, Soon());
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.second, MissReason::kUnavailable);
  EXPECT_FALSE(t->stats().healthy);
  EXPECT_GE(t->stats().errors, 1u);
  // While it backs off, stores are dropped, not queued.
  EXPECT_FALSE(t->Store(Item(blocks_[0])));
  server_.Start();
  // Within the backoff (0.1 s, doubling) the tier tries again.
  bool healthy = false;
  for (int i = 0; i < 100 && !healthy; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    r = t->LoadRun(Loads({blocks_[0]}, &out), kNs, 5, Soon());
    healthy = r.second == MissReason::kAbsent;  // the store came back empty
  }
  EXPECT_TRUE(healthy);
  EXPECT_TRUE(t->stats().healthy);
  ASSERT_TRUE(t->Store(Item(blocks_[0])));
  t->Flush(Soon());
  r = t->LoadRun(Loads({blocks_[0]}, &out), kNs, 5, Soon());
  EXPECT_EQ(r.first, 1);
}

TEST_F(RemoteTierTest, ASlowStoreIsADeadlineNotAWait) {
  auto t = OpenTier(server_.port());
  for (const Block& b : blocks_) t->Store(Item(b));
  t->Flush(Soon());
  // The server sleeps 1 s; the load's deadline is 100 ms away.
  std::thread sleeper([&] {
    auto s = server_.Client();
    (void)s->Pipeline({{"DEBUG", "SLEEP", "1"}}, absl::Seconds(3));
  });
  absl::SleepFor(absl::Milliseconds(100));
  std::vector<std::vector<uint8_t>> out;
  const absl::Time t0 = absl::Now();
  auto r = t->LoadRun(Loads(blocks_, &out), kNs, 5,
                      absl::Now() + absl::Milliseconds(100));
  EXPECT_LT(absl::Now() - t0, absl::Milliseconds(400));
  sleeper.join();
  EXPECT_EQ(r.first, 0);
  EXPECT_EQ(r.second, MissReason::kDeadline);
}

TEST_F(RemoteTierTest, PurgeByScopeAndSalt) {
  auto t = OpenTier(server_.port());
  for (int i = 0; i < 10; ++i) t->Store(Item(blocks_[i], 5));
  for (int i = 10; i < 20; ++i) t->Store(Item(blocks_[i], 6));
  t->Flush(Soon());
  auto purged = t->Purge(6, std::nullopt);
  ASSERT_TRUE(purged.ok()) << purged.status();
  EXPECT_EQ(*purged, 10);
  purged = t->Purge(std::nullopt, SaltTag(kNs));
  ASSERT_TRUE(purged.ok());
  EXPECT_EQ(*purged, 10);
}

TEST(RedisUrlTest, ParsesAndRefuses) {
  auto t = ParseRedisUrl("redis://cache.internal:6380/2");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->host, "cache.internal");
  EXPECT_EQ(t->port, 6380);
  EXPECT_EQ(t->db, 2);
  t = ParseRedisUrl("redis://127.0.0.1");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->port, 6379);
  EXPECT_EQ(t->db, 0);
  for (const char* bad :
       {"http://x:1", "redis://:pw@x:1", "redis://x:0", "redis://x:99999",
        "redis://x:1/db", "redis://", "redis://x:1/-1"}) {
    auto r = ParseRedisUrl(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--kv-remote-cache"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace kvserve::kvtier
