// Sealed blocks (kvtier/block_cipher.h, SealBlock/OpenBlock): the round
// trip, nothing of the tokens or payload left readable, and every way a
// sealed block can be wrong (another key, an altered byte, moved to another
// key or namespace, other tokens) is a miss; the key file's checks; sealed
// blocks through the disk tier.
#include "kvtier/block_cipher.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtier/block_codec.h"
#include "kvtier/disk_tier.h"

namespace kvserve::kvtier {
namespace {

namespace fs = std::filesystem;

constexpr size_t kPayload = 5000;
const Key kSalt = absl::MakeUint128(9, 9);

BlockCipher::KeyBytes KeyOf(uint8_t seed) {
  BlockCipher::KeyBytes k;
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(seed + i);
  return k;
}

struct Sealed {
  BlockHeader h;
  std::vector<uint8_t> plain;
  std::vector<uint8_t> header = std::vector<uint8_t>(kHeaderBytes);
  std::vector<uint8_t> payload;
};

Sealed Make(const BlockCipher& c) {
  Sealed s;
  s.h.salt = kSalt;
  s.h.key = absl::MakeUint128(1, 2);
  s.h.parent = absl::MakeUint128(3, 4);
  s.h.ns = absl::MakeUint128(5, 6);
  s.h.payload_bytes = kPayload;
  s.h.tokens = {1111, 2222, 3333, 4444};
  s.plain.resize(kPayload);
  for (size_t i = 0; i < kPayload; ++i) s.plain[i] = static_cast<uint8_t>(i);
  s.payload = s.plain;
  EXPECT_TRUE(SealBlock(c, s.h, absl::MakeSpan(s.payload), s.header.data()));
  return s;
}

Expected Want(const Sealed& s, const BlockCipher* c) {
  return {kSalt, s.h.key, s.h.parent, s.h.ns, s.h.tokens, kPayload, c};
}

// CheckHeader, the checksum, then OpenBlock: what a tier does on a load.
std::optional<MissReason> Load(Sealed s, const BlockCipher& c,
                               const Expected& want,
                               std::vector<uint8_t>* out = nullptr) {
  if (auto m = CheckHeader(s.header.data(), StoredBlockBytes(kPayload), want)) {
    return m;
  }
  ChecksumCheck check(s.header.data());
  check.Add(s.payload.data(), s.payload.size());
  if (!check.Matches()) return MissReason::kChecksum;
  const Piece p[] = {{s.payload.data(), 2000}, {s.payload.data() + 2000, 3000}};
  auto r = OpenBlock(c, s.header.data(), p, want);
  if (out != nullptr) *out = s.payload;
  return r;
}

bool Contains(const std::vector<uint8_t>& hay, const void* needle, size_t n) {
  const auto* p = static_cast<const uint8_t*>(needle);
  return std::search(hay.begin(), hay.end(), p, p + n) != hay.end();
}

TEST(BlockCipherTest, RoundTripLeavesNothingReadable) {
  const BlockCipher c(KeyOf(1));
  const Sealed s = Make(c);
  EXPECT_FALSE(Contains(s.header, s.h.tokens.data(), 16));
  EXPECT_NE(s.payload, s.plain);
  EXPECT_FALSE(Contains(s.payload, s.plain.data() + 100, 32));
  std::vector<uint8_t> out;
  EXPECT_EQ(Load(s, c, Want(s, &c), &out), std::nullopt);
  EXPECT_EQ(out, s.plain);
  // Two seals of one block differ (a fresh nonce each).
  const Sealed again = Make(c);
  EXPECT_NE(again.payload, s.payload);
  EXPECT_EQ(c.id().rfind("aes-256-gcm:", 0), 0u);
  EXPECT_NE(c.id(), BlockCipher(KeyOf(2)).id());
}

TEST(BlockCipherTest, EveryWrongSealedBlockIsAMiss) {
  const BlockCipher c(KeyOf(1));
  const BlockCipher other(KeyOf(2));
  const Sealed s = Make(c);
  // Another key: the tag fails.
  EXPECT_EQ(Load(s, other, Want(s, &other)), MissReason::kChecksum);
  // Read as plain, or a plain block read as sealed: another format.
  EXPECT_EQ(Load(s, c, Want(s, nullptr)), MissReason::kFingerprint);
  // Other tokens: only visible once decrypted.
  Expected w = Want(s, &c);
  const std::vector<int32_t> tokens = {1111, 2222, 3333, 4445};
  w.tokens = tokens;
  EXPECT_EQ(Load(s, c, w), MissReason::kTokens);
  // Moved under another key: its header names the old one.
  w = Want(s, &c);
  w.key = absl::MakeUint128(7, 7);
  EXPECT_EQ(Load(s, c, w), MissReason::kTokens);
  // A header rewritten to the new key (were its checksum redone) fails the
  // tag: the key is in the additional data.
  Sealed moved = s;
  moved.header[48 + 15] ^= 1;
  const Piece p{moved.payload.data(), moved.payload.size()};
  EXPECT_EQ(OpenBlock(c, moved.header.data(), absl::MakeConstSpan(&p, 1),
                      Want(s, &c)),
            MissReason::kChecksum);
  // Every byte of the stored block flipped in turn: never a hit.
  for (size_t i = 0; i < kHeaderBytes + kPayload; i += 97) {
    Sealed t = s;
    uint8_t* b = i < kHeaderBytes ? &t.header[i] : &t.payload[i - kHeaderBytes];
    *b ^= 0x10;
    EXPECT_NE(Load(t, c, Want(s, &c)), std::nullopt) << i;
  }
}

class KeyFileTest : public ::testing::Test {
 protected:
  KeyFileTest() {
    std::string t = (fs::temp_directory_path() / "kvkey_XXXXXX").string();
    dir_ = mkdtemp(t.data());
  }
  ~KeyFileTest() override { fs::remove_all(dir_); }
  std::string Write(const std::string& text, mode_t mode) {
    const std::string p = dir_ + "/key";
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    chmod(p.c_str(), mode);
    return p;
  }
  std::string dir_;
};

TEST_F(KeyFileTest, HexOrRawOwnerOnly) {
  const std::string hex(64, 'a');
  auto c = BlockCipher::FromKeyFile(Write(hex + "\n", 0600));
  ASSERT_TRUE(c.ok()) << c.status();
  auto raw = BlockCipher::FromKeyFile(Write(std::string(32, '\xaa'), 0600));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ((*c)->id(), (*raw)->id());  // the same 32 bytes
  auto open = BlockCipher::FromKeyFile(Write(hex, 0644));
  EXPECT_EQ(open.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos);
  auto short_key = BlockCipher::FromKeyFile(Write("abcd", 0600));
  EXPECT_NE(short_key.status().message().find("32-byte key"),
            std::string::npos);
  EXPECT_FALSE(BlockCipher::FromKeyFile(dir_ + "/missing").ok());
}

TEST_F(KeyFileTest, TheDiskTierStoresOnlySealedBytes) {
  auto cipher = std::make_shared<const BlockCipher>(KeyOf(3));
  DiskTierOptions o;
  o.dir = dir_ + "/kv";
  o.capacity_bytes = 1 << 20;
  o.cipher = cipher;
  const Key salt = absl::MakeUint128(4, 4);
  auto t = DiskTier::Open(o, salt, 0, kPayload);
  ASSERT_TRUE(t.ok()) << t.status();
  StoreItem it;
  it.header.salt = salt;
  it.header.key = absl::MakeUint128(1, 1);
  it.header.ns = absl::MakeUint128(2, 2);
  it.header.payload_bytes = kPayload;
  it.header.tokens = {777001, 777002};
  std::vector<uint8_t> plain(kPayload);
  for (size_t i = 0; i < kPayload; ++i) plain[i] = static_cast<uint8_t>(i * 3);
  auto owned = std::make_shared<const std::vector<uint8_t>>(plain);
  it.payload = absl::MakeConstSpan(*owned);
  it.owner = std::move(owned);
  ASSERT_TRUE((*t)->Store(it));
  (*t)->Flush(absl::Now() + absl::Seconds(5));
  for (const auto& e : fs::recursive_directory_iterator(o.dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream in(e.path(), std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    EXPECT_FALSE(Contains(bytes, it.header.tokens.data(), 8));
    EXPECT_FALSE(Contains(bytes, plain.data() + 64, 64));
  }
  std::vector<uint8_t> out(kPayload);
  const Piece p{out.data(), out.size()};
  const Expected want{salt,         it.header.key,    0,
                      it.header.ns, it.header.tokens, kPayload};
  EXPECT_EQ((*t)->Load(want, 0, absl::MakeConstSpan(&p, 1)), std::nullopt);
  EXPECT_EQ(out, plain);
}

}  // namespace
}  // namespace kvserve::kvtier
