#include "common/page_buffer.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "gtest/gtest.h"

namespace kvserve {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(PageBufferTest, ReservingManyGiBCommitsNothing) {
  // 8 GiB: a KV budget larger than a test machine could fill in time.
  auto buf = PageBuffer::Reserve(8192 * kMiB, "test");
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(buf->size(), 8192 * kMiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % (2 * kMiB), 0u);
  EXPECT_EQ(buf->ResidentBytes(), 0);
}

TEST(PageBufferTest, CommitsOnlyWhatIsWrittenAndReadsZeros) {
  auto buf = PageBuffer::Reserve(64 * kMiB, "test");
  ASSERT_TRUE(buf.ok()) << buf.status();
  std::memset(buf->data() + 10 * kMiB, 0x5a, kMiB);
  const int64_t resident = buf->ResidentBytes();
  EXPECT_GE(resident, kMiB);
  // At most the transparent huge pages around the written megabyte.
  EXPECT_LE(resident, 4 * kMiB);
  // (Reading maps the kernel's zero page, which mincore counts: read last.)
  for (int64_t i = 0; i < buf->size(); i += 4096 * 7) {
    const bool written = i >= 10 * kMiB && i < 11 * kMiB;
    ASSERT_EQ(buf->data()[i], written ? 0x5a : 0) << i;
  }
}

TEST(PageBufferTest, ZeroClearsPartialPagesAndReleasesWholeOnes) {
  auto buf = PageBuffer::Reserve(16 * kMiB, "test");
  ASSERT_TRUE(buf.ok()) << buf.status();
  char* d = buf->data();
  std::memset(d, 0x11, 16 * kMiB);
  // An unaligned range: partial pages at both ends, whole ones inside.
  const int64_t off = kMiB + 100, len = 3 * kMiB + 5000;
  buf->Zero(off, len);
  // Before reading: a read maps the kernel's zero page, which counts.
  EXPECT_LE(buf->ResidentBytes(), 16 * kMiB - 3 * kMiB + 8192);
  for (int64_t i = 0; i < 16 * kMiB; ++i) {
    const bool inside = i >= off && i < off + len;
    ASSERT_EQ(d[i], inside ? 0 : 0x11) << i;
  }
  // Smaller than a page.
  buf->Zero(10 * kMiB + 3, 10);
  EXPECT_EQ(d[10 * kMiB + 2], 0x11);
  EXPECT_EQ(d[10 * kMiB + 3], 0);
  EXPECT_EQ(d[10 * kMiB + 12], 0);
  EXPECT_EQ(d[10 * kMiB + 13], 0x11);
}

TEST(PageBufferTest, MoveTransfersTheMapping) {
  auto buf = PageBuffer::Reserve(kMiB, "test");
  ASSERT_TRUE(buf.ok()) << buf.status();
  buf->data()[5] = 7;
  PageBuffer moved = std::move(*buf);
  EXPECT_EQ(buf->data(), nullptr);
  EXPECT_EQ(buf->size(), 0);
  EXPECT_EQ(moved.data()[5], 7);
  PageBuffer empty;
  empty = std::move(moved);
  EXPECT_EQ(empty.data()[5], 7);
}

TEST(PageBufferTest, AnImpossibleReservationIsResourceExhausted) {
  // 2^50 bytes (1 PiB): beyond the 47-bit user address space, so refused
  // whatever the overcommit policy; the error names the flag.
  auto buf = PageBuffer::Reserve(int64_t{1} << 50, "--kv-cache-bytes");
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(buf.status().message().find("--kv-cache-bytes"), std::string::npos);
}

}  // namespace
}  // namespace kvserve
