#include "common/page_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

namespace kvserve {
namespace {

constexpr int64_t kAlign = int64_t{2} << 20;  // a transparent huge page
// Huge pages from here on: rounding a touch up to 2 MiB costs at most 1/32.
constexpr int64_t kHugePagesFrom = int64_t{64} << 20;

int64_t PageSize() {
  static const int64_t page = sysconf(_SC_PAGESIZE);
  return page;
}

}  // namespace

PageBuffer::PageBuffer(PageBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)) {}

PageBuffer& PageBuffer::operator=(PageBuffer&& o) noexcept {
  if (this != &o) {
    Unmap();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
  }
  return *this;
}

PageBuffer::~PageBuffer() { Unmap(); }

void PageBuffer::Unmap() {
  if (map_ != nullptr) munmap(map_, map_bytes_);
  map_ = nullptr;
  data_ = nullptr;
  size_ = map_bytes_ = 0;
}

absl::StatusOr<PageBuffer> PageBuffer::Reserve(int64_t bytes,
                                               const char* what) {
  PageBuffer b;
  if (bytes <= 0) return b;
  const int64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  const size_t map_bytes = static_cast<size_t>(rounded + kAlign);
  void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: cannot reserve %d bytes (%s)", what, bytes, strerror(errno)));
  }
  b.map_ = static_cast<char*>(p);
  b.map_bytes_ = map_bytes;
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  b.data_ = reinterpret_cast<char*>((base + kAlign - 1) / kAlign * kAlign);
  b.size_ = bytes;
  // Best effort: fewer TLB misses when attention walks the pages.
  if (rounded >= kHugePagesFrom) madvise(b.data_, rounded, MADV_HUGEPAGE);
  return b;
}

void PageBuffer::Zero(int64_t offset, int64_t bytes) {
  if (bytes <= 0) return;
  const int64_t page = PageSize();
  const int64_t end = offset + bytes;
  const int64_t first = (offset + page - 1) / page * page;
  const int64_t last = end / page * page;
  if (first >= last) {
    std::memset(data_ + offset, 0, bytes);
    return;
  }
  std::memset(data_ + offset, 0, first - offset);
  std::memset(data_ + last, 0, end - last);
  // A private anonymous page given back reads as zeros on its next touch.
  if (madvise(data_ + first, last - first, MADV_DONTNEED) != 0) {
    std::memset(data_ + first, 0, last - first);
  }
}

int64_t PageBuffer::ResidentBytes() const {
  if (data_ == nullptr) return 0;
  const int64_t page = PageSize();
  const int64_t pages = (size_ + page - 1) / page;
  std::vector<unsigned char> in_core(pages);
  if (mincore(data_, pages * page, in_core.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n * page;
}

}  // namespace kvserve
