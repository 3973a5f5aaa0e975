// The stored block format: keys and names round-trip, a header encodes and
// verifies, and every altered field, truncation or flipped bit is the miss
// it should be, never a hit.
#include "kvtier/block_codec.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kvtier/block_key.h"

namespace kvserve::kvtier {
namespace {

BlockFormat Format() {
  BlockFormat f;
  f.fingerprint = absl::MakeUint128(1, 2);
  f.kv_dtype = "int8";
  f.rotation_k = 64;
  f.rotation_v = 64;
  f.block_size = 16;
  f.num_layers = 30;
  f.num_kv_heads = 3;
  f.head_dim = 64;
  f.numerics = "cpu-n1";
  f.layout = "cpu-rows-v1";
  f.payload_bytes = 195840;
  return f;
}

TEST(BlockKeyTest, SaltChangesWithEveryField) {
  const Key base = ModelKvSalt(Format());
  EXPECT_EQ(base, ModelKvSalt(Format()));
  std::vector<BlockFormat> variants(12, Format());
  variants[0].fingerprint = absl::MakeUint128(1, 3);
  variants[1].kv_dtype = "fp16";
  variants[2].rotation_k = 32;
  variants[3].rotation_v = 0;
  variants[4].block_size = 32;
  variants[5].num_layers = 29;
  variants[6].num_kv_heads = 4;
  variants[7].head_dim = 128;
  variants[8].tensor_parallel = 2;
  variants[9].numerics = "cpu-n2";
  variants[10].layout = "cuda-v1";
  variants[11].payload_bytes = 1;
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(ModelKvSalt(variants[i]), base) << "field " << i;
  }
}

TEST(BlockKeyTest, NamesRoundTrip) {
  const BlockName n{absl::MakeUint128(0xab00000000000001, 7), 0x1234, ~0ull};
  const std::string file = BlockFileName(n);
  EXPECT_EQ(file.size(), 70u);
  const std::optional<BlockName> back = ParseBlockFileName(file);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->key, n.key);
  EXPECT_EQ(back->scope_tag, n.scope_tag);
  EXPECT_EQ(back->salt_tag, n.salt_tag);
  EXPECT_EQ(BlockSubdir(n.key), "ab");
  EXPECT_EQ(ParseHex128(Hex128(n.key)), n.key);
  EXPECT_FALSE(ParseBlockFileName(".tmp." + file).has_value());
  EXPECT_FALSE(ParseBlockFileName(file.substr(0, 69) + "x").has_value());
  std::string upper = file;
  upper[0] = 'A';
  EXPECT_FALSE(ParseBlockFileName(upper).has_value());
  EXPECT_NE(ScopeTag("kv:1", "tenant:a"), ScopeTag("kv:1", "tenant:b"));
  EXPECT_NE(ScopeTag("kv:1a", ""), ScopeTag("kv:1", "a"));
}

struct Stored {
  std::vector<uint8_t> header = std::vector<uint8_t>(kHeaderBytes);
  std::vector<uint8_t> payload;
  BlockHeader h;
  Expected want;
};

Stored MakeBlock() {
  Stored s;
  s.payload.resize(1000);
  for (size_t i = 0; i < s.payload.size(); ++i) {
    s.payload[i] = static_cast<uint8_t>(i * 7);
  }
  s.h.salt = absl::MakeUint128(9, 9);
  s.h.key = absl::MakeUint128(1, 1);
  s.h.parent = absl::MakeUint128(2, 2);
  s.h.ns = absl::MakeUint128(3, 3);
  s.h.payload_bytes = s.payload.size();
  s.h.tokens = {5, 6, 7, 8};
  const ConstPiece p{s.payload.data(), s.payload.size()};
  EncodeHeader(s.h, absl::MakeConstSpan(&p, 1), s.header.data());
  s.want = {s.h.salt, s.h.key,    s.h.parent,
            s.h.ns,   s.h.tokens, s.h.payload_bytes};
  return s;
}

bool PayloadMatches(const Stored& s) {
  ChecksumCheck c(s.header.data());
  c.Add(s.payload.data(), 600);
  c.Add(s.payload.data() + 600, 400);
  return c.Matches();
}

TEST(BlockCodecTest, RoundTripVerifies) {
  const Stored s = MakeBlock();
  EXPECT_EQ(StoredBlockBytes(1000), 8192u);
  EXPECT_EQ(StoredBlockBytes(4096), 8192u);
  EXPECT_EQ(CheckHeader(s.header.data(), 8192, s.want), std::nullopt);
  EXPECT_TRUE(PayloadMatches(s));
}

TEST(BlockCodecTest, EachMismatchIsItsMiss) {
  const Stored s = MakeBlock();
  const uint8_t* hdr = s.header.data();
  Expected w = s.want;
  EXPECT_EQ(CheckHeader(hdr, 8191, w), MissReason::kChecksum);
  w.salt += 1;
  EXPECT_EQ(CheckHeader(hdr, 8192, w), MissReason::kFingerprint);
  w = s.want;
  w.payload_bytes = 999;
  EXPECT_EQ(CheckHeader(hdr, 8192, w), MissReason::kFingerprint);
  for (int field = 0; field < 4; ++field) {
    w = s.want;
    std::vector<int32_t> other = s.h.tokens;
    if (field == 0) w.key += 1;
    if (field == 1) w.parent += 1;
    if (field == 2) w.ns += 1;
    if (field == 3) {
      other[3] = 9;
      w.tokens = other;
    }
    EXPECT_EQ(CheckHeader(hdr, 8192, w), MissReason::kTokens) << field;
  }
  std::vector<int32_t> fewer = {5, 6, 7};
  w = s.want;
  w.tokens = fewer;
  EXPECT_EQ(CheckHeader(hdr, 8192, w), MissReason::kTokens);
}

TEST(BlockCodecTest, EveryFlippedBitIsCaught) {
  // A bit flipped anywhere in the header or payload: a miss, never a hit.
  const Stored s = MakeBlock();
  for (size_t byte = 0; byte < kHeaderBytes + s.payload.size(); byte += 3) {
    Stored t = s;
    uint8_t* b =
        byte < kHeaderBytes ? &t.header[byte] : &t.payload[byte - kHeaderBytes];
    *b ^= static_cast<uint8_t>(1u << (byte % 8));
    const bool header_ok =
        !CheckHeader(t.header.data(), 8192, t.want).has_value();
    EXPECT_FALSE(header_ok && PayloadMatches(t)) << "byte " << byte;
  }
}

TEST(BlockCodecTest, MissReasonsHaveNames) {
  for (int r = 0; r < kNumMissReasons; ++r) {
    EXPECT_NE(MissReasonName(static_cast<MissReason>(r)), "unknown");
  }
}

}  // namespace
}  // namespace kvserve::kvtier
