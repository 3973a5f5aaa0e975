// Packing of ggml rows into QuantTiles (models/cpu/matmul_internal.h says
// the layout). Q4_0, Q4_1 and Q8_0 rows are copied quant by quant; every
// other type goes through models/quant_blocks.h's decoder, into Q4_1 tiles
// (Q4_K) or I8S16 tiles (the rest).
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "models/cpu/quant_kernels.h"
#include "models/quant_blocks.h"

namespace kvserve::models::cpu::internal {
namespace {

size_t ScaleBytesPerBlock(const QuantTiles& w) {
  switch (w.kind) {
    case QuantKind::kQ4_1:
      return 64;  // 16 fp16 d + 16 fp16 m
    case QuantKind::kI8S16:
      return w.has_offsets ? 256 : 128;  // 2 x 16 fp32 scales (+ offsets)
    default:
      return 32;  // 16 fp16 d
  }
}

// Row `row` of the concatenation: its type and bytes.
struct RowRef {
  GgmlType type;
  const uint8_t* data;
};

RowRef FindRow(const std::vector<QuantRows>& parts, int64_t cols, int64_t row) {
  for (const QuantRows& p : parts) {
    if (row < p.rows) {
      return {p.type, static_cast<const uint8_t*>(p.data) +
                          row * RowBytes(p.type, cols)};
    }
    row -= p.rows;
  }
  return {GgmlType::kF32, nullptr};
}

// Copies one row of Q4_0 / Q4_1 / Q8_0 blocks into lane r of a tile.
void PackLegacyRow(QuantKind kind, const uint8_t* s, int64_t nb, int r,
                   uint8_t* dst) {
  const int64_t qb = kind == QuantKind::kQ8_0 ? 512 : 256;
  uint16_t* d = reinterpret_cast<uint16_t*>(dst + nb * qb);
  uint16_t* mins = d + nb * kTileRows;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* q = dst + b * qb + r * 4;
    if (kind == QuantKind::kQ8_0) {
      BlockQ8_0 blk;
      std::memcpy(&blk, s + b * sizeof(blk), sizeof(blk));
      for (int g = 0; g < 8; ++g) {
        for (int i = 0; i < 4; ++i) {
          q[g * 64 + i] = static_cast<uint8_t>(blk.qs[4 * g + i]) ^ 0x80;
        }
      }
      d[b * kTileRows + r] = blk.d;
    } else if (kind == QuantKind::kQ4_1) {
      BlockQ4_1 blk;
      std::memcpy(&blk, s + b * sizeof(blk), sizeof(blk));
      for (int g = 0; g < 4; ++g) std::memcpy(q + g * 64, blk.qs + 4 * g, 4);
      d[b * kTileRows + r] = blk.d;
      mins[b * kTileRows + r] = blk.m;
    } else {
      BlockQ4_0 blk;
      std::memcpy(&blk, s + b * sizeof(blk), sizeof(blk));
      for (int g = 0; g < 4; ++g) std::memcpy(q + g * 64, blk.qs + 4 * g, 4);
      d[b * kTileRows + r] = blk.d;
    }
  }
}

// Decoded values of one row (q in 0..15, one scale and offset per 32) into
// lane r of a Q4_1 tile; the scale and offset are rounded to fp16.
void PackDecodedQ4Row(const int8_t* q, const float* scale, const float* offset,
                      int64_t nb, int r, uint8_t* dst) {
  uint16_t* d = reinterpret_cast<uint16_t*>(dst + nb * 256);
  uint16_t* mins = d + nb * kTileRows;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* qb = q + b * kQBlock;
    uint8_t* out = dst + b * 256 + r * 4;
    for (int g = 0; g < 4; ++g) {
      for (int i = 0; i < 4; ++i) {
        const int j = 4 * g + i;
        out[g * 64 + i] = static_cast<uint8_t>(qb[j] | (qb[j + 16] << 4));
      }
    }
    d[b * kTileRows + r] = Fp32ToFp16(scale[2 * b]);
    mins[b * kTileRows + r] = Fp32ToFp16(offset[2 * b]);
  }
}

// Decoded values of one row into lane r of an I8S16 tile.
void PackDecodedI8Row(const int8_t* q, const float* scale, const float* offset,
                      int64_t nb, bool has_offsets, int r, uint8_t* dst) {
  auto* sc = reinterpret_cast<float*>(dst + nb * 512);
  const int64_t per_block = has_offsets ? 64 : 32;
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* qb = q + b * kQBlock;
    uint8_t* out = dst + b * 512 + r * 4;
    for (int g = 0; g < 8; ++g) {
      for (int i = 0; i < 4; ++i) {
        out[g * 64 + i] = static_cast<uint8_t>(qb[4 * g + i]) ^ 0x80;
      }
    }
    float* s = sc + b * per_block;
    for (int h = 0; h < 2; ++h) {
      s[16 * h + r] = scale[2 * b + h];
      if (has_offsets) s[32 + 16 * h + r] = offset[2 * b + h];
    }
  }
}

// Fills tile t from the rows of `parts`; rows past the end stay zero.
void PackTile(const QuantTiles& w, const std::vector<QuantRows>& parts,
              int64_t t, uint8_t* dst) {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<float> offset;
  for (int r = 0; r < kTileRows; ++r) {
    const int64_t row = t * kTileRows + r;
    if (row >= w.rows) break;
    const RowRef src = FindRow(parts, w.cols, row);
    // Q4_0, Q4_1 and Q8_0 tiles take their own type's quants as they are;
    // Q4_K rows in Q4_1 tiles and all I8S16 rows are decoded.
    if (w.kind != QuantKind::kI8S16 && src.type != GgmlType::kQ4_K) {
      PackLegacyRow(w.kind, src.data, w.nb, r, dst);
      continue;
    }
    q.resize(w.cols);
    scale.resize(w.cols / kDecodeGroup);
    offset.resize(w.cols / kDecodeGroup);
    DecodeBlocks(src.type, src.data, w.cols, q.data(), scale.data(),
                 offset.data());
    if (w.kind == QuantKind::kQ4_1) {
      PackDecodedQ4Row(q.data(), scale.data(), offset.data(), w.nb, r, dst);
    } else {
      PackDecodedI8Row(q.data(), scale.data(), offset.data(), w.nb,
                       w.has_offsets, r, dst);
    }
  }
}

// The tile kind for a set of row types (see PackQuantTiles).
absl::StatusOr<QuantKind> ChooseKind(const std::vector<QuantRows>& parts) {
  bool same = true;
  bool q4 = true;  // all Q4_K or Q4_1
  for (const QuantRows& p : parts) {
    if (!IsDecodable(p.type)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackQuantTiles: not a quantized type: ",
                       std::string(TypeName(p.type))));
    }
    same &= p.type == parts[0].type;
    q4 &= p.type == GgmlType::kQ4_K || p.type == GgmlType::kQ4_1;
  }
  if (same && parts[0].type == GgmlType::kQ4_0) return QuantKind::kQ4_0;
  if (same && parts[0].type == GgmlType::kQ8_0) return QuantKind::kQ8_0;
  if (q4) return QuantKind::kQ4_1;
  return QuantKind::kI8S16;
}

}  // namespace

absl::StatusOr<QuantTiles> PackQuantTiles(const std::vector<QuantRows>& parts,
                                          int64_t cols) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("PackQuantTiles: no rows");
  }
  QuantTiles w;
  KV_ASSIGN_OR_RETURN(w.kind, ChooseKind(parts));
  for (const QuantRows& p : parts) {
    const int block = TypeTraits(p.type).block_size;
    if (cols <= 0 || cols % block != 0 || p.rows <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackQuantTiles: bad shape ", p.rows, " x ", cols,
                       " for ", std::string(TypeName(p.type))));
    }
    w.rows += p.rows;
    w.has_offsets |= w.kind == QuantKind::kI8S16 && HasOffsets(p.type);
  }
  w.cols = cols;
  w.nb = cols / kQBlock;
  w.num_tiles = (w.rows + kTileRows - 1) / kTileRows;
  const size_t per_block = w.QuantBytesPerBlock() + ScaleBytesPerBlock(w);
  w.tile_stride = (w.nb * per_block + AlignedBuffer::kAlignment - 1) /
                  AlignedBuffer::kAlignment * AlignedBuffer::kAlignment;
  w.buf.Resize(w.tile_stride * w.num_tiles);
  ParallelFor(w.num_tiles, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      PackTile(w, parts, t, w.buf.data() + t * w.tile_stride);
    }
  });
  return w;
}

absl::StatusOr<QuantTiles> PackQuantTiles(GgmlType type, const void* src,
                                          int64_t rows, int64_t cols) {
  return PackQuantTiles(std::vector<QuantRows>{{type, src, rows}}, cols);
}

}  // namespace kvserve::models::cpu::internal
