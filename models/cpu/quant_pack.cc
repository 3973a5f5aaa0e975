// Packing of ggml rows into QuantTiles (models/cpu/matmul_internal.h says
// the layout). Q4_0, Q4_1 and Q8_0 rows are copied quant by quant; every
// other type goes through models/quant_blocks.h's decoder into the nibble
// tiles of its own kind. Rows of several types are packed as one segment
// per run of a type.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "models/cpu/quant_kernels.h"
#include "models/quant_blocks.h"

namespace kvserve::models::cpu::internal {
namespace {

// Per 32-block; a K kind's fp16 scales per 256 are spread over its 8 blocks.
size_t ScaleBytesPerBlock(const QuantTiles& w) {
  if (w.kind == QuantKind::kQ8_0) return 32;  // 16 fp16 d
  const NibbleSpec s = SpecOf(w.kind);
  const size_t sets = s.mins ? 2 : 1;  // scales, and mins
  if (!s.super) return 32 * sets;      // 16 fp16 each
  const size_t min_bytes = s.mins && !s.packed ? 16 * s.halves : 0;
  return s.SubBytes() + min_bytes + sets * 32 / 8;
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

// Unsigned quants u (0..63) of one 32-block into lane r of a nibble tile's
// block at `qb`: the base field, then the bit planes above it.
void PutQuants(const int* u, const NibbleSpec& s, int r, uint8_t* qb) {
  auto* masks = reinterpret_cast<uint64_t*>(qb + 64 * s.base);
  const int field = (1 << s.base) - 1;
  for (int h = 0; h < 2; ++h) {
    for (int g = 0; g < 4; ++g) {
      for (int i = 0; i < 4; ++i) {
        const int v = u[16 * h + 4 * g + i];
        if (s.base == 4) {
          qb[g * 64 + r * 4 + i] |= static_cast<uint8_t>((v & field) << 4 * h);
        } else {
          qb[h * 64 + r * 4 + i] |= static_cast<uint8_t>((v & field) << 2 * g);
        }
        for (int p = 0; p < s.planes; ++p) {
          masks[8 * p + 4 * h + g] |=
              static_cast<uint64_t>((v >> (s.base + p)) & 1) << (4 * r + i);
        }
      }
    }
  }
}

// The IQ4 code-book index of a decoded value.
int Iq4Index(int v) {
  for (int i = 0; i < 16; ++i) {
    if (kIq4NlValues[i] == v) return i;
  }
  KV_CHECK(false, "not an IQ4 code-book value: ", v);
  return 0;
}

// The integer n with x == n * unit (DecodeBlocks's scales and mins are such
// products, exact in fp32); 0 when unit is 0, infinite or NaN (the tile
// keeps that unit, so its products are what the file's give: 0 or NaN).
int IntegerOf(float x, float unit) {
  if (unit == 0.0f || !std::isfinite(unit)) return 0;
  const float n = std::nearbyint(x / unit);
  KV_CHECK(n * unit == x, "K-quant scale ", x, " is not a multiple of ", unit);
  return static_cast<int>(n);
}

// Sub-scale `sub` (-32..31) of half h, row r into a sub6 block's bytes
// (matmul_internal.h).
void PutSub6(int sub, int h, int r, uint8_t* p) {
  KV_CHECK(sub >= -32 && sub < 32, "6-bit sub-scale out of range: ", sub);
  const int v = sub + 32;
  p[r] = static_cast<uint8_t>(p[r] | (v & 15) << (4 * h));
  uint8_t& high = p[16 + 4 * h + r / 4];
  high = static_cast<uint8_t>(high | (v >> 4) << (2 * (r % 4)));
}

// Decoded values of one row of a K-quant `type` (raw blocks at `src`) into
// lane r of a K tile: quants u = q + zero (IQ4_XS: code-book indices), the
// integer sub-scales and mins recovered from DecodeBlocks's scales and
// offsets, and the fp16 d and dmin of each 256-block as the file has them.
void PackSuperRow(const QuantTiles& w, GgmlType type, const uint8_t* src,
                  const int8_t* q, const float* scale, const float* offset,
                  int r, uint8_t* dst) {
  const NibbleSpec s = SpecOf(w.kind);
  const int64_t qbytes = w.QuantBytesPerBlock();
  const int64_t nb = w.nb;
  auto* subs = reinterpret_cast<int8_t*>(dst + nb * qbytes);
  uint8_t* mins = reinterpret_cast<uint8_t*>(subs) + nb * s.SubBytes();
  const bool min_array = s.mins && !s.packed;
  auto* d =
      reinterpret_cast<uint16_t*>(mins + (min_array ? nb * s.halves * 16 : 0));
  uint16_t* dmin = d + nb / 8 * kTileRows;
  const size_t block_bytes = TypeTraits(type).type_size;
  for (int64_t b = 0; b < nb; ++b) {
    const SuperScales sup = KSuperScales(type, src + b / 8 * block_bytes);
    if (b % 8 == 0) {
      d[b / 8 * kTileRows + r] = Fp32ToFp16(sup.d);
      if (s.mins) dmin[b / 8 * kTileRows + r] = Fp32ToFp16(sup.dmin);
    }
    int u[kQBlock];
    for (int k = 0; k < kQBlock; ++k) {
      const int v = q[b * kQBlock + k];
      u[k] = s.lut ? Iq4Index(v) : v + s.zero;
    }
    PutQuants(u, s, r, dst + b * qbytes);
    for (int h = 0; h < s.halves; ++h) {
      const int64_t at = (b * s.halves + h) * kTileRows + r;
      const int sub = IntegerOf(scale[2 * b + h], sup.d);
      const int min = s.mins ? IntegerOf(-offset[2 * b + h], sup.dmin) : 0;
      if (s.sub6) {
        PutSub6(sub, h, r, reinterpret_cast<uint8_t*>(subs) + b * s.SubBytes());
      } else if (s.packed) {
        subs[at] = static_cast<int8_t>(sub | min << 4);
      } else {
        subs[at] = static_cast<int8_t>(sub);
        if (s.mins) mins[at] = static_cast<uint8_t>(min);
      }
    }
  }
}

// Decoded values of one row (one scale and offset per 32) into lane r of a
// Q5_0, Q5_1 or IQ4_NL tile: quants u = q + zero (IQ4_NL: code-book
// indices), the fp16 scales and offsets as the file has them.
void PackDecodedNibbleRow(QuantKind kind, const int8_t* q, const float* scale,
                          const float* offset, int64_t nb, int r,
                          uint8_t* dst) {
  const NibbleSpec s = SpecOf(kind);
  const int64_t qbytes = s.QuantBytes();
  uint16_t* d = reinterpret_cast<uint16_t*>(dst + nb * qbytes);
  uint16_t* mins = d + nb * kTileRows;
  for (int64_t b = 0; b < nb; ++b) {
    int u[kQBlock];
    for (int k = 0; k < kQBlock; ++k) {
      const int v = q[b * kQBlock + k];
      u[k] = s.lut ? Iq4Index(v) : v + s.zero;
    }
    PutQuants(u, s, r, dst + b * qbytes);
    d[b * kTileRows + r] = Fp32ToFp16(scale[2 * b]);
    if (s.mins) mins[b * kTileRows + r] = Fp32ToFp16(offset[2 * b]);
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
    if (w.kind == QuantKind::kQ4_0 || w.kind == QuantKind::kQ4_1 ||
        w.kind == QuantKind::kQ8_0) {
      PackLegacyRow(w.kind, src.data, w.nb, r, dst);
      continue;
    }
    q.resize(w.cols);
    scale.resize(w.cols / kDecodeGroup);
    offset.resize(w.cols / kDecodeGroup);
    DecodeBlocks(src.type, src.data, w.cols, q.data(), scale.data(),
                 offset.data());
    if (SpecOf(w.kind).super) {
      PackSuperRow(w, src.type, src.data, q.data(), scale.data(), offset.data(),
                   r, dst);
    } else {
      PackDecodedNibbleRow(w.kind, q.data(), scale.data(), offset.data(), w.nb,
                           r, dst);
    }
  }
}

// The tile kind of a type's rows.
absl::StatusOr<QuantKind> KindOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return QuantKind::kQ4_0;
    case GgmlType::kQ4_1:
      return QuantKind::kQ4_1;
    case GgmlType::kQ5_0:
      return QuantKind::kQ5_0;
    case GgmlType::kQ5_1:
      return QuantKind::kQ5_1;
    case GgmlType::kQ8_0:
      return QuantKind::kQ8_0;
    case GgmlType::kIQ4_NL:
      return QuantKind::kIQ4_NL;
    case GgmlType::kQ2_K:
      return QuantKind::kQ2_K;
    case GgmlType::kQ3_K:
      return QuantKind::kQ3_K;
    case GgmlType::kQ4_K:
      return QuantKind::kQ4_K;
    case GgmlType::kQ5_K:
      return QuantKind::kQ5_K;
    case GgmlType::kQ6_K:
      return QuantKind::kQ6_K;
    case GgmlType::kIQ4_XS:
      return QuantKind::kIQ4_XS;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("PackQuantTiles: not a quantized type: ",
                       std::string(TypeName(type))));
  }
}

// Packs rows of one type.
absl::StatusOr<QuantTiles> PackOneType(const std::vector<QuantRows>& parts,
                                       int64_t cols) {
  QuantTiles w;
  KV_ASSIGN_OR_RETURN(w.kind, KindOf(parts[0].type));
  for (const QuantRows& p : parts) w.rows += p.rows;
  w.cols = cols;
  w.out_stride = w.rows;
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

}  // namespace

absl::StatusOr<QuantTiles> PackQuantTiles(const std::vector<QuantRows>& parts,
                                          int64_t cols) {
  if (parts.empty()) {
    return absl::InvalidArgumentError("PackQuantTiles: no rows");
  }
  // Runs of one type, each packed on its own.
  std::vector<std::vector<QuantRows>> runs;
  for (const QuantRows& p : parts) {
    const int block = TypeTraits(p.type).block_size;
    if (cols <= 0 || cols % block != 0 || p.rows <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("PackQuantTiles: bad shape ", p.rows, " x ", cols,
                       " for ", std::string(TypeName(p.type))));
    }
    if (runs.empty() || runs.back()[0].type != p.type) runs.emplace_back();
    runs.back().push_back(p);
  }
  if (runs.size() == 1) return PackOneType(parts, cols);
  QuantTiles w;
  w.cols = cols;
  w.nb = cols / kQBlock;
  for (const std::vector<QuantRows>& run : runs) {
    KV_ASSIGN_OR_RETURN(QuantTiles seg, PackOneType(run, cols));
    seg.out_offset = w.rows;
    w.rows += seg.rows;
    w.num_tiles += seg.num_tiles;
    w.segments.push_back(std::move(seg));
  }
  w.out_stride = w.rows;
  for (QuantTiles& seg : w.segments) seg.out_stride = w.rows;
  return w;
}

absl::StatusOr<QuantTiles> PackQuantTiles(GgmlType type, const void* src,
                                          int64_t rows, int64_t cols) {
  return PackQuantTiles(std::vector<QuantRows>{{type, src, rows}}, cols);
}

}  // namespace kvserve::models::cpu::internal
