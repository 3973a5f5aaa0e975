// CPU linear layers: weight matrices repacked once at load (PackMatrix) and
// y = x * W^T (MatMul) for the Llama forward. Owns the choice of kernel per
// batch size; does not own activations, threads (common/parallel.h) or the
// weight source (everything needed is copied at pack time).
//
// Paths (measured, see docs/PERFORMANCE.md "CPU GEMM path"):
//   m <  OnednnMinRows : Q4_0/Q4_1/Q8_0 -> int8 AVX-512 VNNI on weights kept
//                        4/8-bit in a 16-row interleaved layout, activations
//                        quantized to int8 per 32-block (as llama.cpp);
//                        F32/F16/BF16 -> own AVX-512 kernel, fp32 accumulate.
//   m >= OnednnMinRows : oneDNN matmul (AMX on Sapphire Rapids): bf16
//                        weights dequantized at load, bf16 activations, fp32
//                        output; F32 weights use oneDNN fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/ggml_types.h"
#include "models/weights.h"

namespace kvserve::models::cpu {

namespace internal {
struct PackedData;
}  // namespace internal

// Kernel families; kAuto picks by type and m. The others exist for tests
// and benchmarks and require the matching representation (PackOptions).
enum class MatMulPath {
  kAuto,
  kInt8Vnni,    // quantized types only: int8 activations x 4/8-bit weights
  kOwnFloat,    // F32/F16/BF16 weights: own AVX-512 kernel, fp32 accumulate
  kOnednnBf16,  // oneDNN (AMX) on bf16 weights, bf16 activations
  kOnednnF32,   // oneDNN on fp32 weights (F32 type, or all_paths)
};
// "auto", "int8_vnni", ... (benchmark names, messages).
const char* PathName(MatMulPath p);

// Batch size (rows of x) from which kAuto uses the oneDNN path for weights
// of `type` (measured, 2 threads, whole-model sweeps, docs/PERFORMANCE.md):
//   quantized: 48. Below it int8 wins by streaming 4x fewer weight bytes
//     than bf16; int8 was faster at m = 40, even at 48..56, AMX from 64.
//   F16/BF16:  4. Both stream 2 bytes per weight; the own fp32-accumulate
//     kernel is faster at m <= 2 (and exact), AMX from m = 4 on.
//   F32:       32 (own kernel vs oneDNN fp32; bf16 would break 1e-5).
constexpr int64_t OnednnMinRows(GgmlType type) {
  switch (type) {
    case GgmlType::kF16:
    case GgmlType::kBF16:
      return 4;
    case GgmlType::kF32:
      return 32;
    default:
      return 48;
  }
}

struct PackOptions {
  // Keep the oneDNN (bf16 / fp32) copy used for m >= OnednnMinRows(type).
  // Without it every m runs the small-m kernels (slower prefill, less
  // memory).
  bool prefill = true;
  // Also build every other representation (fp32 rows for kOwnFloat and
  // kOnednnF32 on quantized types, bf16 for F32): benchmarks and tests.
  bool all_paths = false;
};

// A weight matrix of rows() output features x cols() inputs in the layouts
// the kernels want. Owns all its memory (the RawTensor may die after
// PackMatrix). Movable, not copyable. Immutable after packing, so it can be
// shared by threads, but MatMul itself is called from one thread at a time.
// A moved-from PackedMatrix may only be assigned to or destroyed.
class PackedMatrix {
 public:
  PackedMatrix();
  explicit PackedMatrix(std::unique_ptr<internal::PackedData> data);
  PackedMatrix(PackedMatrix&&) noexcept;
  PackedMatrix& operator=(PackedMatrix&&) noexcept;
  ~PackedMatrix();

  int64_t rows() const;
  int64_t cols() const;
  GgmlType source_type() const;
  // Bytes owned by all representations together.
  size_t bytes() const;
  // True if `path` can run on this matrix (kAuto always can).
  bool Supports(MatMulPath path) const;

  // The representations; for the kernels in models/cpu/ only.
  const internal::PackedData& data() const { return *data_; }

 private:
  std::unique_ptr<internal::PackedData> data_;
};

// Packs `t` (t.shape = {cols, rows}; type F32, F16, BF16, Q4_0, Q4_1 or Q8_0;
// for quantized types cols % 32 == 0). InvalidArgument naming the tensor on a
// bad shape, size or type.
[[nodiscard]] absl::StatusOr<PackedMatrix> PackMatrix(
    const RawTensor& t, const PackOptions& options = {});

// y[i, r] = sum_k x[i, k] * W[r, k] for i in [0, m). x row stride = cols,
// y row stride = rows (both contiguous). Parallelizes internally with
// kvserve::ParallelFor; call from one thread at a time.
void MatMul(const float* x, int64_t m, const PackedMatrix& w, float* y);

// MatMul forcing a kernel family; KV_CHECKs w.Supports(path).
void MatMulWithPath(const float* x, int64_t m, const PackedMatrix& w, float* y,
                    MatMulPath path);

// Weights of `t` dequantized to fp32 (rows x cols, row-major) with ggml's
// semantics: test references and benchmark baselines.
[[nodiscard]] absl::StatusOr<std::vector<float>> DequantizeToF32(
    const RawTensor& t);

}  // namespace kvserve::models::cpu
