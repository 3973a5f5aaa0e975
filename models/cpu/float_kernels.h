// Float-weight pieces of the CPU GEMM path: own AVX-512 kernel for F32/F16/
// BF16 rows with fp32 accumulation, and ggml dequantization to fp32. Scalar
// fallbacks where AVX-512 is not compiled in.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/cpu/matmul_internal.h"
#include "models/ggml_types.h"

namespace kvserve::models::cpu::internal {

// Copies `rows` x `cols` elements of `type` (F32, F16 or BF16) from `src`.
[[nodiscard]] absl::StatusOr<FloatRows> PackFloatRows(GgmlType type,
                                                      const void* src,
                                                      int64_t rows,
                                                      int64_t cols);

// FloatRows of type F32 holding `src` (rows x cols, row-major) copied.
FloatRows FloatRowsFromF32(const float* src, int64_t rows, int64_t cols);

// y[i, r] = sum_k x[i, k] W[r, k], fp32 accumulation. Parallel over rows.
// `portable` forces the scalar code.
void FloatMatMul(const float* x, int64_t m, const FloatRows& w, float* y,
                 bool portable = false);

// Decodes `rows` ggml rows of `cols` elements of `type` (F32, F16, BF16,
// Q4_0, Q4_1, Q8_0) into dst (rows x cols fp32). cols must be a multiple of
// the type's block size.
[[nodiscard]] absl::Status DequantizeRows(GgmlType type, const void* src,
                                          int64_t rows, int64_t cols,
                                          float* dst);

}  // namespace kvserve::models::cpu::internal
