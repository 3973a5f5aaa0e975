// oneDNN side of the CPU GEMM path (prefill, m >= 16): weights reordered
// once into the blocked layout oneDNN's brgemm (AMX on Sapphire Rapids)
// wants, and a process-wide cache of matmul primitives keyed by shape. Uses
// oneDNN's C API (status codes, no exceptions). Owns the oneDNN engine and
// stream; threads come from oneDNN's OpenMP runtime (same pool as
// kvserve::ParallelFor), sized to kvserve::NumThreads().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvserve::models::cpu::internal {

class OnednnWeights {
 public:
  enum class Kind {
    kBf16,  // bf16 weights and activations (x converted per call), fp32 out
    kF32,   // fp32 throughout
  };

  // Reorders `src` (rows x cols, row-major; uint16 bf16 bit patterns for
  // kBf16, float for kF32) into oneDNN's preferred layout.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<OnednnWeights>> Create(
      Kind kind, const void* src, int64_t rows, int64_t cols);
  ~OnednnWeights();
  OnednnWeights(const OnednnWeights&) = delete;
  OnednnWeights& operator=(const OnednnWeights&) = delete;

  Kind kind() const;
  size_t bytes() const;

  // y = x W^T for m rows (x: m x cols fp32, y: m x rows fp32). m is split in
  // chunks of up to 512 rows, each padded to a multiple of 16 so a bounded
  // set of primitives is created. False if oneDNN cannot run this shape:
  // the caller then recomputes all of y another way.
  [[nodiscard]] bool MatMul(const float* x, int64_t m, float* y) const;

  // oneDNN's implementation name for an m-row product, e.g.
  // "brg:avx512_core_amx_bf16"; empty if none.
  std::string ImplName(int64_t m) const;

 private:
  struct Impl;
  explicit OnednnWeights(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvserve::models::cpu::internal
