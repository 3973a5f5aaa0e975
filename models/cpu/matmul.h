// CPU linear layers: weight matrices repacked once at load (PackMatrix) and
// y = x * W^T (MatMul) for the Llama forward. Owns the choice of kernel per
// weight type; does not own activations, threads (common/parallel.h) or the
// weight source (everything needed is copied at pack time).
//
// Paths (measured, see docs/PERFORMANCE.md "CPU GEMM path"), the same for
// every m, so a row's result does not depend on the rest of its batch:
//   quantized      -> int8 AVX-512 VNNI on weights in a 16-row interleaved
//                     layout, activations quantized to int8 per 32-block
//                     (as llama.cpp): Q4_0/Q4_1/Q8_0 keep their quants, Q4_K
//                     goes to 4-bit Q4_1 tiles, Q5_0/Q5_1/Q5_K to 5-bit
//                     tiles (4-bit quants plus a bit plane), Q2_K/Q3_K/Q6_K
//                     and IQ4_NL/IQ4_XS to int8 with an fp32 scale and
//                     offset per 16 weights (exact, 10-12 bits per weight);
//   F32/F16/BF16   -> own AVX-512 kernel, fp32 accumulate.
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

// Kernel families; kAuto picks by type (kInt8Vnni for quantized types,
// kOwnFloat for float types). The others exist for tests and benchmarks and
// require the matching representation (PackOptions).
enum class MatMulPath {
  kAuto,
  kInt8Vnni,  // quantized types only: int8 activations x 4/8-bit weights
  kOwnFloat,  // F32/F16/BF16 weights (or all_paths): own AVX-512 kernel,
              // fp32 accumulate
};
// "auto", "int8_vnni", ... (benchmark names, messages).
const char* PathName(MatMulPath p);

struct PackOptions {
  // Also keep fp32 rows of quantized weights, for kOwnFloat: benchmarks and
  // tests.
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
  // True if its quantized tiles (or one segment's) are small enough for
  // SetSmallTilePrefetch to apply.
  bool HasSmallTiles() const;

  // The representations; for the kernels in models/cpu/ only.
  const internal::PackedData& data() const { return *data_; }

 private:
  std::unique_ptr<internal::PackedData> data_;
};

// Packs `t` (t.shape = {cols, rows}; type F32, F16, BF16 or any quantized
// type models/quant_blocks.h decodes; cols a multiple of its block size).
// InvalidArgument naming the tensor on a bad shape, size or type.
[[nodiscard]] absl::StatusOr<PackedMatrix> PackMatrix(
    const RawTensor& t, const PackOptions& options = {});

// Packs the row-wise concatenation of quantized `parts` (same cols, types
// may differ, as K-quant mixes store Q, K and V) as one matrix on the int8
// path. InvalidArgument naming the tensor on a bad part.
[[nodiscard]] absl::StatusOr<PackedMatrix> PackQuantizedRows(
    const std::vector<RawTensor>& parts);

// y[i, r] = sum_k x[i, k] * W[r, k] for i in [0, m). x row stride = cols,
// y row stride = rows (both contiguous). Parallelizes internally with
// kvserve::ParallelFor; call from one thread at a time.
void MatMul(const float* x, int64_t m, const PackedMatrix& w, float* y);

// MatMul forcing a kernel family; KV_CHECKs w.Supports(path).
void MatMulWithPath(const float* x, int64_t m, const PackedMatrix& w, float* y,
                    MatMulPath path);

// Where the quantized kernels prefetch the next weight tile of a matrix whose
// tiles are at most 16 KiB (models of hidden size up to ~1,000; larger tiles
// always go to L2). Process-wide; results do not depend on it, only speed,
// and which level streams faster depends on the core (AMD Zen 4: L2, 1.2-1.6x
// the decode matmuls' rate on the 135M model; a core that keeps up better
// with L1 fills may differ). CpuLlamaModel::Create measures both on its own
// weights and keeps the faster.
enum class TilePrefetchLevel { kL1, kL2 };
void SetSmallTilePrefetch(TilePrefetchLevel level);
[[nodiscard]] TilePrefetchLevel SmallTilePrefetch();
[[nodiscard]] const char* TilePrefetchLevelName(TilePrefetchLevel level);

// Weights of `t` dequantized to fp32 (rows x cols, row-major) with ggml's
// semantics: test references and benchmark baselines.
[[nodiscard]] absl::StatusOr<std::vector<float>> DequantizeToF32(
    const RawTensor& t);

}  // namespace kvserve::models::cpu
