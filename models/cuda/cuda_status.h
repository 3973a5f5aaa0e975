// CUDA / cuBLAS error checking at absl::Status boundaries, and an owning
// device buffer (plain cudaMalloc; never managed memory). Host code only.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvserve::models::cuda {

inline absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const absl::StatusCode code = err == cudaErrorMemoryAllocation
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(
      code, absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorName(err),
                         " (", cudaGetErrorString(err), ")"));
}

inline absl::Status CublasStatus(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuBLAS error in ", what, ": ", cublasGetStatusString(st)));
}

}  // namespace kvserve::models::cuda

// Returns an absl::Status naming `expr` from the enclosing function when the
// CUDA runtime call fails.
#define KV_CUDA_RETURN_IF_ERROR(expr)                                  \
  do {                                                                 \
    const cudaError_t kv_cuda_err_ = (expr);                           \
    if (kv_cuda_err_ != cudaSuccess) {                                 \
      return ::kvserve::models::cuda::CudaStatus(kv_cuda_err_, #expr); \
    }                                                                  \
  } while (0)

#define KV_CUBLAS_RETURN_IF_ERROR(expr)                                   \
  do {                                                                    \
    const cublasStatus_t kv_cublas_st_ = (expr);                          \
    if (kv_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                         \
      return ::kvserve::models::cuda::CublasStatus(kv_cublas_st_, #expr); \
    }                                                                     \
  } while (0)

namespace kvserve::models::cuda {

// Where a CudaBuffer lives: device memory (cudaMalloc), or page-locked host
// memory (cudaMallocHost), which the copy engines reach directly: copies to
// and from it run at full bus speed and asynchronously, where pageable
// memory is staged through a driver buffer.
enum class CudaMemory { kDevice, kPinnedHost };

// Owns one allocation; movable, freed on destruction.
template <CudaMemory kWhere>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  CudaBuffer(CudaBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~CudaBuffer() { Reset(); }

  // Frees the old allocation, then allocates `bytes` (contents undefined).
  [[nodiscard]] absl::Status Allocate(int64_t bytes, const char* what) {
    Reset();
    if (bytes <= 0) return absl::OkStatus();
    void* p = nullptr;
    const cudaError_t err =
        kWhere == CudaMemory::kDevice
            ? cudaMalloc(&p, static_cast<size_t>(bytes))
            : cudaMallocHost(&p, static_cast<size_t>(bytes));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky-free allocation error
      return absl::Status(
          err == cudaErrorMemoryAllocation
              ? absl::StatusCode::kResourceExhausted
              : absl::StatusCode::kInternal,
          absl::StrCat(
              kWhere == CudaMemory::kDevice ? "cudaMalloc" : "cudaMallocHost",
              " of ", bytes, " bytes for ", what, ": ",
              cudaGetErrorString(err)));
    }
    ptr_ = p;
    bytes_ = bytes;
    return absl::OkStatus();
  }
  // Grows to at least `bytes` (contents lost when it grows).
  [[nodiscard]] absl::Status Reserve(int64_t bytes, const char* what) {
    if (bytes <= bytes_) return absl::OkStatus();
    return Allocate(bytes, what);
  }
  void Reset() {
    if (ptr_ != nullptr) {
      (void)(kWhere == CudaMemory::kDevice ? cudaFree(ptr_)
                                           : cudaFreeHost(ptr_));
    }
    ptr_ = nullptr;
    bytes_ = 0;
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  int64_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

using DeviceBuffer = CudaBuffer<CudaMemory::kDevice>;
using PinnedBuffer = CudaBuffer<CudaMemory::kPinnedHost>;

}  // namespace kvserve::models::cuda
