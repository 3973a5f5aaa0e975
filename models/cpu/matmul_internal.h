// Internal representations behind PackedMatrix, shared by the kernel files
// of the CPU GEMM path (quant_kernels, float_kernels). Not for
// use outside models/cpu/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "models/cpu/aligned_buffer.h"
#include "models/ggml_types.h"

namespace kvserve::models::cpu::internal {

// kI8S16 holds any decodable type (models/quant_blocks.h) as int8 values with
// an fp32 scale (and offset) per 16 elements; the others keep the ggml
// 4- or 8-bit quants of their type (Q4_1 tiles also hold Q4_K).
enum class QuantKind { kQ4_0, kQ4_1, kQ8_0, kI8S16 };

// Rows per interleaved tile: one int32 lane of a 512-bit register per row.
inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kQBlock = 32;

// Quantized weights, 16-row interleaved. Tile t holds rows [16t, 16t + 16)
// (rows past the end are zero) at buf + t * tile_stride:
//
//   [quants: nb x QB bytes][d: nb x 16 fp16][m: nb x 16 fp16, Q4_1 only]
//
// For block b, the quants are groups g of 64 bytes = 16 rows x 4 bytes; lane
// r of group g holds 4 consecutive k of row r, which is what one VPDPBUSD
// consumes against 4 activation bytes broadcast to all lanes:
//   Q4_0/Q4_1 (QB = 256, g = 0..3): byte i of (g, r) = ggml qs[4g + i] of
//     row r: low nibble = k 4g + i, high nibble = k 16 + 4g + i.
//   Q8_0 (QB = 512, g = 0..7): byte i of (g, r) = q[4g + i] + 128 (unsigned).
//   I8S16 (QB = 512): quants as Q8_0; then, for the two 16-element halves h
//     of the block, 16 fp32 scales [h][r], and with offsets 16 fp32 offsets
//     [h][r] (in place of d and m).
struct QuantTiles {
  QuantKind kind = QuantKind::kQ4_0;
  bool has_offsets = false;  // kI8S16 only
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t nb = 0;         // 32-blocks per row
  int64_t num_tiles = 0;  // ceil(rows / 16)
  size_t tile_stride = 0;
  AlignedBuffer buf;

  int64_t QuantBytesPerBlock() const {
    return kind == QuantKind::kQ8_0 || kind == QuantKind::kI8S16 ? 512 : 256;
  }
  const uint8_t* Tile(int64_t t) const {
    return buf.data() + static_cast<size_t>(t) * tile_stride;
  }
};

// Plain row-major weights (rows x cols) in F32, F16 or BF16.
struct FloatRows {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  AlignedBuffer buf;
};

struct PackedData {
  int64_t rows = 0;
  int64_t cols = 0;
  GgmlType type = GgmlType::kF32;
  std::optional<QuantTiles> tiles;      // quantized types
  std::optional<FloatRows> float_rows;  // float types (or all_paths)

  size_t Bytes() const {
    size_t n = 0;
    if (tiles) n += tiles->buf.size();
    if (float_rows) n += float_rows->buf.size();
    return n;
  }
};

}  // namespace kvserve::models::cpu::internal
