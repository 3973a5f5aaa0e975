// PageBuffer: a large zero-filled region reserved from the kernel (an
// anonymous private mapping) whose pages are committed on first touch. The
// KV pool and the host swap space are many GiB; reserving them this way
// costs no time at start and no resident memory until a block is written.
// The reservation itself is checked by the kernel's overcommit policy, so a
// budget far beyond the machine still fails at start, not on first use.
// Movable, not copyable; the mapping is 2 MiB aligned, and a buffer of at
// least 64 MiB asks for transparent huge pages where the kernel offers them
// (a smaller one would commit a whole 2 MiB page per touched block: the KV
// pool is one buffer per layer and K/V, so a small pool would be resident
// in full after its first request).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace kvserve {

class PageBuffer {
 public:
  PageBuffer() = default;
  PageBuffer(PageBuffer&& o) noexcept;
  PageBuffer& operator=(PageBuffer&& o) noexcept;
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  ~PageBuffer();

  // ResourceExhausted (naming `what`) when the kernel refuses the mapping.
  [[nodiscard]] static absl::StatusOr<PageBuffer> Reserve(int64_t bytes,
                                                          const char* what);

  char* data() const { return data_; }
  int64_t size() const { return size_; }

  // Makes [offset, offset + bytes) read as zeros again; whole pages inside
  // the range go back to the kernel (no longer resident), the partial pages
  // at its ends are cleared in place.
  void Zero(int64_t offset, int64_t bytes);

  // Bytes of the region now backed by memory (mincore), for tests and logs.
  [[nodiscard]] int64_t ResidentBytes() const;

 private:
  void Unmap();

  char* data_ = nullptr;
  int64_t size_ = 0;
  char* map_ = nullptr;  // the whole mapping, alignment slack included
  size_t map_bytes_ = 0;
};

}  // namespace kvserve
