// The model fingerprint: content, not names; any sampled byte, the size and
// the extra (rope scale) change it; directories hash their files by name.
#include "models/loader/model_fingerprint.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/models/model_writer_testutil.h"

namespace kvserve::models {
namespace {

using testing::ScopedTempDir;

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i * 131 + seed);
  return s;
}

absl::uint128 Fp(const std::string& path, const std::string& extra = "",
                 uint64_t full_limit = kFullHashBytes) {
  absl::StatusOr<ModelFingerprint> fp =
      FingerprintModel(path, extra, full_limit);
  EXPECT_TRUE(fp.ok()) << fp.status();
  return fp.ok() ? fp->hash : 0;
}

TEST(ModelFingerprintTest, ContentNotName) {
  ScopedTempDir dir;
  const std::string bytes = Bytes(100000, 1);
  testing::WriteFile(dir.File("a.gguf"), bytes);
  testing::WriteFile(dir.File("b.gguf"), bytes);
  EXPECT_EQ(Fp(dir.File("a.gguf")), Fp(dir.File("b.gguf")));
  std::string edited = bytes;
  edited[77777] ^= 1;
  testing::WriteFile(dir.File("b.gguf"), edited);
  EXPECT_NE(Fp(dir.File("a.gguf")), Fp(dir.File("b.gguf")));
  testing::WriteFile(dir.File("b.gguf"), bytes + "x");
  EXPECT_NE(Fp(dir.File("a.gguf")), Fp(dir.File("b.gguf")));
  EXPECT_NE(Fp(dir.File("a.gguf"), "rope_scale=2"), Fp(dir.File("a.gguf")));
  absl::StatusOr<ModelFingerprint> fp =
      FingerprintModel(dir.File("a.gguf"), "");
  ASSERT_TRUE(fp.ok());
  EXPECT_TRUE(fp->full);
  EXPECT_EQ(fp->hashed, bytes.size());
  EXPECT_FALSE(FingerprintModel(dir.File("missing.gguf"), "").ok());
}

TEST(ModelFingerprintTest, SampledPastTheLimit) {
  ScopedTempDir dir;
  // Past the 16 MiB head, 32 MiB sampled every ~8 KiB by 4 KiB pages.
  const size_t n = (size_t{48} << 20) + 12345;
  std::string bytes = Bytes(n, 3);
  testing::WriteFile(dir.File("a.gguf"), bytes);
  absl::StatusOr<ModelFingerprint> fp =
      FingerprintModel(dir.File("a.gguf"), "", /*full_limit=*/1 << 20);
  ASSERT_TRUE(fp.ok());
  EXPECT_FALSE(fp->full);
  EXPECT_LT(fp->hashed, n);
  const absl::uint128 base = fp->hash;
  // In the head, and in a sampled page: changed. Between samples: the
  // documented blind spot.
  const size_t head_byte = 1000, sampled = (size_t{16} << 20) + 10;
  const size_t span = n - (size_t{16} << 20);
  const size_t unsampled = (size_t{16} << 20) + span / 4096 + 4096 + 5;
  for (size_t at : {head_byte, sampled, unsampled}) {
    std::string edited = bytes;
    edited[at] ^= 1;
    testing::WriteFile(dir.File("a.gguf"), edited);
    EXPECT_EQ(Fp(dir.File("a.gguf"), "", 1 << 20) != base, at != unsampled)
        << at;
  }
}

TEST(ModelFingerprintTest, DirectoryHashesItsWeightAndConfigFiles) {
  ScopedTempDir one, two;
  for (const ScopedTempDir* d : {&one, &two}) {
    testing::WriteFile(d->File("config.json"), "{\"a\": 1}");
    testing::WriteFile(d->File("model.safetensors"), Bytes(5000, 2));
    testing::WriteFile(d->File("README.md"), "ignored");
  }
  EXPECT_EQ(Fp(one.path()), Fp(two.path()));
  testing::WriteFile(two.File("README.md"), "still ignored");
  EXPECT_EQ(Fp(one.path()), Fp(two.path()));
  testing::WriteFile(two.File("config.json"), "{\"a\": 2}");
  EXPECT_NE(Fp(one.path()), Fp(two.path()));
}

}  // namespace
}  // namespace kvserve::models
