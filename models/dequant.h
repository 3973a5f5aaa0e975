// Dequantization of ggml tensor data to fp32 on the CPU, with ggml's exact
// semantics, for the types kvserve supports (F32, F16, BF16, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS). Used by the loaders' consumers
// (weight upload, reference forward, tests); the fast fused kernels live with
// the CPU backend.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/ggml_types.h"
#include "models/weights.h"

namespace kvserve::models {

// Decodes `n` consecutive elements of type `type` from `src` into `dst`.
// `n` must be a multiple of the type's block size; `src` must hold
// RowBytes(type, n) bytes (unaligned is fine). InvalidArgument naming the
// type if it is unsupported.
[[nodiscard]] absl::Status DequantizeRow(GgmlType type, const void* src,
                                         float* dst, int64_t n);

// Decodes row `row` (of shape[0] elements) of `t` into `dst`, which must
// hold t.shape[0] floats. InvalidArgument if the row is out of range, the
// type is unsupported, or t.nbytes does not match its shape.
[[nodiscard]] absl::Status DequantizeTensorRow(const RawTensor& t, int64_t row,
                                               float* dst);

// Decodes a whole tensor (all NumElements() values, ggml order).
[[nodiscard]] absl::StatusOr<std::vector<float>> DequantizeTensor(
    const RawTensor& t);

}  // namespace kvserve::models
