// MappedFile::DropResidentPages: the process's resident pages of the mapping
// go (measured in /proc/self/smaps), and the bytes still read the same.
#include "models/loader/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "tests/models/model_writer_testutil.h"

namespace kvserve::models {
namespace {

using testing::ScopedTempDir;
using testing::WriteFile;

// Rss of the mapping that starts at `addr`, in kB (-1 if not found).
int64_t MappingRssKb(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  const auto want = reinterpret_cast<uintptr_t>(addr);
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0;
    uintptr_t hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find('-') < line.find(' ')) {
      in_mapping = lo == want;
      continue;
    }
    int64_t kb = 0;
    if (in_mapping && std::sscanf(line.c_str(), "Rss: %ld kB", &kb) == 1) {
      return kb;
    }
  }
  return -1;
}

TEST(MappedFileTest, DropResidentPagesKeepsTheBytes) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/weights.bin";
  constexpr size_t kBytes = size_t{8} << 20;
  std::string bytes(kBytes, '\0');
  for (size_t i = 0; i < kBytes; ++i) bytes[i] = static_cast<char>(i * 131);
  WriteFile(path, bytes);
  auto file = MappedFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const MappedFile& f = **file;
  uint64_t sum = 0;
  for (size_t i = 0; i < f.size(); i += 512) sum += f.data()[i];
  const int64_t touched = MappingRssKb(f.data());
  ASSERT_GE(touched, 6 * 1024) << "every page was read";

  f.DropResidentPages();
  EXPECT_LT(MappingRssKb(f.data()), 1024);
  uint64_t again = 0;
  for (size_t i = 0; i < f.size(); i += 512) again += f.data()[i];
  EXPECT_EQ(again, sum);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data()), f.size()),
            bytes);
}

}  // namespace
}  // namespace kvserve::models
