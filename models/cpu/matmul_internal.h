// Internal representations behind PackedMatrix, shared by the kernel files
// of the CPU GEMM path (quant_kernels, float_kernels). Not for
// use outside models/cpu/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "models/cpu/aligned_buffer.h"
#include "models/ggml_types.h"

namespace kvserve::models::cpu::internal {

// Every quantized type keeps its quants: in 4-bit nibbles (plus bit planes
// above them for 5 and 6 bits), or in bytes for Q8_0. The K kinds keep the
// K-quants' integer sub-scales under an fp16 scale per 256, so every kind
// is exact.
enum class QuantKind {
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kIQ4_NL,
  kQ8_0,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_XS,
};

// How a nibble kind (all but Q8_0) stores and scales its quants:
// weight = scale * (u - zero) - min, u the nibble plus its bit planes (or
// the IQ4 code book's value + 128 at the nibble).
struct NibbleSpec {
  int base = 4;         // bits of u in the base field: 4 (nibbles) or 2
  int planes = 0;       // bit planes above the base field
  bool lut = false;     // the nibble indexes kIq4NlValues
  int zero = 0;         // subtracted from u
  bool mins = false;    // an offset per scale group
  bool super = false;   // int8 sub-scales (u8 mins) x fp16 d (dmin) per 256
  int halves = 1;       // sub-scales per 32-block (super only): 1 or 2
  bool packed = false;  // a 4-bit sub-scale and min in one byte (Q2_K)
  bool sub6 = false;    // 6-bit sub-scales + 32, as the file (Q3_K, halves 2)

  // Bytes of a block's sub-scales in a K tile: an int8 per row and group,
  // or (sub6) 16 bytes of low nibbles (half 0 low, half 1 high, one byte
  // per row) and per half a 32-bit word of the 2-bit high parts (row r at
  // bits 2r, 2r + 1).
  constexpr int64_t SubBytes() const { return sub6 ? 24 : 16 * halves; }

  // Bytes of a block's quants (base field and planes) in a tile.
  constexpr int64_t QuantBytes() const { return 64 * base + 64 * planes; }
};
constexpr NibbleSpec SpecOf(QuantKind k) {
  switch (k) {
    case QuantKind::kQ4_0:
      return {.zero = 8};
    case QuantKind::kQ4_1:
      return {.mins = true};
    case QuantKind::kQ5_0:
      return {.planes = 1, .zero = 16};
    case QuantKind::kQ5_1:
      return {.planes = 1, .mins = true};
    case QuantKind::kIQ4_NL:
      return {.lut = true, .zero = 128};
    case QuantKind::kQ2_K:
      return {
          .base = 2, .mins = true, .super = true, .halves = 2, .packed = true};
    case QuantKind::kQ3_K:
      return {.base = 2,
              .planes = 1,
              .zero = 4,
              .super = true,
              .halves = 2,
              .sub6 = true};
    case QuantKind::kQ4_K:
      return {.mins = true, .super = true};
    case QuantKind::kQ5_K:
      return {.planes = 1, .mins = true, .super = true};
    case QuantKind::kQ6_K:
      return {.planes = 2, .zero = 32, .super = true, .halves = 2};
    case QuantKind::kIQ4_XS:
      return {.lut = true, .zero = 128, .super = true};
    default:
      return {};
  }
}

// Rows per interleaved tile: one int32 lane of a 512-bit register per row.
inline constexpr int64_t kTileRows = 16;
inline constexpr int64_t kQBlock = 32;

// The sub-scale of row r, group h of block b in a K tile's sub-scale array
// `subs` (for packed: the low 4 bits, the min being the high 4).
inline int SubScale(const NibbleSpec& s, const uint8_t* subs, int64_t b, int h,
                    int r) {
  if (s.sub6) {
    const uint8_t* p = subs + b * s.SubBytes();
    const int low = (p[r] >> (4 * h)) & 15;
    const int high = (p[16 + 4 * h + r / 4] >> (2 * (r % 4))) & 3;
    return (low | high << 4) - 32;
  }
  const uint8_t v = subs[(b * s.halves + h) * kTileRows + r];
  return s.packed ? v & 15 : static_cast<int8_t>(v);
}

// Quantized weights, 16-row interleaved. Tile t holds rows [16t, 16t + 16)
// (rows past the end are zero) at buf + t * tile_stride:
//
//   [quants: nb x QB bytes][d: nb x 16 fp16][m: nb x 16 fp16, with mins]
//
// or, for the K kinds (super in NibbleSpec),
//
//   [quants: nb x QB][sub-scales: nb x halves x 16 int8, [b][h][r], or
//    nb x 24 bytes for sub6 (NibbleSpec::SubBytes)]
//   [mins: as the sub-scales, u8, with mins][d: nb/8 x 16 fp16][dmin: same]
//
// (packed: sub-scale | min << 4 in the sub-scale byte, no mins array).
//
// For block b, the quants are groups g of 64 bytes = 16 rows x 4 bytes; lane
// r of group g holds 4 consecutive k of row r, which is what one VPDPBUSD
// consumes against 4 activation bytes broadcast to all lanes:
//   nibble kinds, 4-bit base (QB = 256 + 64 planes, g = 0..3): byte i of
//     (g, r): low nibble = k 4g + i, high nibble = k 16 + 4g + i (for
//     Q4_0/Q4_1 ggml's qs[4g + i]);
//   2-bit base (QB = 128 + 64 planes): byte i of (h, r), h = 0, 1: bits
//     2g, 2g + 1 = k 16h + 4g + i;
//   then per plane p eight 64-bit masks at 64 base + 64p: mask 4h + g, bit
//     4r + i = bit base + p of element 16h + 4g + i of row r, so a masked
//     byte add completes group g of half h.
//   Q8_0 (QB = 512, g = 0..7): byte i of (g, r) = q[4g + i] + 128 (unsigned).
//
// Rows of several types (Q and K in Q4_K, V in Q6_K, as the K-quant mixes
// store them) form one matrix of segments, one per run of a type, each
// packed in its own kind and writing its rows of the output.
struct QuantTiles {
  QuantKind kind = QuantKind::kQ4_0;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t nb = 0;         // 32-blocks per row
  int64_t num_tiles = 0;  // ceil(rows / 16)
  size_t tile_stride = 0;
  AlignedBuffer buf;
  // Row `row` for activation row i goes to y[i * out_stride + out_offset +
  // row]: a segment's rows are part of its whole matrix's.
  int64_t out_stride = 0;
  int64_t out_offset = 0;
  // When not empty, this matrix is these, stacked (num_tiles their sum; the
  // kind, tiles and buffer of this one unused).
  std::vector<QuantTiles> segments;

  size_t Bytes() const {
    size_t n = buf.size();
    for (const QuantTiles& s : segments) n += s.Bytes();
    return n;
  }

  int64_t QuantBytesPerBlock() const {
    if (kind == QuantKind::kQ8_0) return 512;
    return SpecOf(kind).QuantBytes();
  }
  // The elements per activation scale the kind's dot product uses, as
  // llama.cpp's vec_dot_type for the type: 256 (Q8_K) for the K kinds, 32
  // (Q8_0 / Q8_1) for the others.
  int ActGroup() const {
    return kind != QuantKind::kQ8_0 && SpecOf(kind).super ? 256 : 32;
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
    if (tiles) n += tiles->Bytes();
    if (float_rows) n += float_rows->buf.size();
    return n;
  }
};

// Where a K tile's per-block sub-scales, mins and per-256 d, dmin lie
// (packed: both in the sub-scale bytes, `mins` = `subs`).
struct SuperLayout {
  const int8_t* subs;    // [b][h][r]
  const uint8_t* mins;   // [b][h][r]
  const uint16_t* d;     // [b / 8][r]
  const uint16_t* dmin;  // [b / 8][r]

  int Sub(const NibbleSpec& s, int64_t b, int h, int r) const {
    return SubScale(s, reinterpret_cast<const uint8_t*>(subs), b, h, r);
  }
  int Min(const NibbleSpec& s, int64_t at) const {
    return s.packed ? mins[at] >> 4 : mins[at];
  }
};
// (s: SpecOf(w.kind), passed in so that kernels give the constant.)
[[gnu::always_inline]] inline SuperLayout SuperOf(const QuantTiles& w,
                                                  const NibbleSpec& s,
                                                  const uint8_t* tile) {
  const int64_t n = w.nb * s.SubBytes();
  const int64_t n_mins = w.nb * s.halves * kTileRows;
  const auto* subs =
      reinterpret_cast<const int8_t*>(tile + w.nb * s.QuantBytes());
  const bool min_array = s.mins && !s.packed;
  const auto* mins =
      reinterpret_cast<const uint8_t*>(s.packed ? subs : subs + n);
  const auto* d =
      reinterpret_cast<const uint16_t*>(subs + n + (min_array ? n_mins : 0));
  return {subs, mins, d, d + w.nb / 8 * kTileRows};
}

}  // namespace kvserve::models::cpu::internal
