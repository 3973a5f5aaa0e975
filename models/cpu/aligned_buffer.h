// AlignedBuffer: an owned, movable, 64-byte aligned byte buffer for packed
// weights and kernel scratch. Owns memory only; knows nothing of layouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace kvserve::models::cpu {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  // Zero-filled buffer of `bytes` bytes.
  explicit AlignedBuffer(size_t bytes) { Resize(bytes); }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  // Discards the contents; the new buffer is zero-filled.
  void Resize(size_t bytes) {
    std::free(data_);
    data_ = nullptr;
    size_ = bytes;
    if (bytes == 0) return;
    const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    data_ = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, rounded));
    std::memset(data_, 0, rounded);
  }
  // Grows (discarding contents) only when smaller than `bytes`.
  void EnsureSize(size_t bytes) {
    if (size_ < bytes) Resize(bytes);
  }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvserve::models::cpu
