// The KV row formats of models/cpu/kv_rows.h read with Highway vectors, for
// the CPU attention kernel (models/cpu/paged_attention.cc, its only
// includer, which defines HWY_COMPILE_ONLY_STATIC and includes Highway
// first): whole rows decoded into an f32 tile, and "row sources" that load
// vector c of a tile's row t either from such a tile or from the cache in
// place, converting in registers. Every path gives the values DecodeKvRow
// gives, so which one the kernel uses never changes a bit of its result.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "kvcache/kv_sizing.h"
#include "models/cpu/kv_residual.h"
#include "models/cpu/kv_rows.h"

namespace kvserve::models::cpu_attn {

namespace hn = hwy::HWY_NAMESPACE;
using kvcache::KvDtype;
using DF = hn::ScalableTag<float>;
inline constexpr int kGroup = kvcache::kKvQuantGroup;

// Decodes one KV row of `dtype` into out[0, dd) in registers, lanes at a
// time (element order and values as DecodeKvRow).
HWY_INLINE void DecodeRow(KvDtype dtype, const std::byte* row, int dd,
                          float* out) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(out, row, sizeof(float) * dd);
      return;
    case KvDtype::kF16: {
      const hn::Rebind<hwy::float16_t, DF> dh;
      const auto* src = reinterpret_cast<const hwy::float16_t*>(row);
      int i = 0;
      for (; i + lanes <= dd; i += lanes) {
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, src + i)), d, out + i);
      }
      for (; i < dd; ++i) out[i] = cpu::HalfToFloat(src[i].bits);
      return;
    }
    case KvDtype::kBF16: {
      const hn::Rebind<hwy::bfloat16_t, DF> db;
      const auto* src = reinterpret_cast<const hwy::bfloat16_t*>(row);
      int i = 0;
      for (; i + lanes <= dd; i += lanes) {
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(db, src + i)), d, out + i);
      }
      for (; i < dd; ++i) out[i] = hwy::F32FromBF16(src[i]);
      return;
    }
    case KvDtype::kInt8: {
      // q8_0 blocks: fp16 scale, 32 int8. lanes <= 16 divides 32.
      const hn::Rebind<int8_t, DF> d8;
      const hn::RebindToSigned<DF> di;
      for (int g = 0; g < dd / kGroup; ++g) {
        const std::byte* b = row + g * (kGroup + 2);
        uint16_t h;
        std::memcpy(&h, b, 2);
        const auto scale = hn::Set(d, cpu::HalfToFloat(h));
        const auto* q = reinterpret_cast<const int8_t*>(b + 2);
        for (int j = 0; j < kGroup; j += lanes) {
          const auto v =
              hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, q + j)));
          hn::StoreU(hn::Mul(v, scale), d, out + g * kGroup + j);
        }
      }
      return;
    }
    case KvDtype::kInt4: {
      // q4_0 blocks: fp16 scale, 16 bytes; element j < 16 is the low nibble
      // of byte j, element 16 + j its high nibble.
      const hn::Rebind<uint8_t, DF> du8;
      const hn::RebindToSigned<DF> di;
      const auto mask = hn::Set(di, 0xf), eight = hn::Set(di, 8);
      for (int g = 0; g < dd / kGroup; ++g) {
        const std::byte* b = row + g * (kGroup / 2 + 2);
        uint16_t h;
        std::memcpy(&h, b, 2);
        const auto scale = hn::Set(d, cpu::HalfToFloat(h));
        const auto* qs = reinterpret_cast<const uint8_t*>(b + 2);
        for (int j = 0; j < kGroup / 2; j += lanes) {
          const auto bytes =
              hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(),
                                            hn::LoadU(du8, qs + j)));
          const auto lo = hn::Sub(hn::And(bytes, mask), eight);
          const auto hi = hn::Sub(hn::ShiftRight<4>(bytes), eight);
          float* o = out + g * kGroup + j;
          hn::StoreU(hn::Mul(hn::ConvertTo(d, lo), scale), d, o);
          hn::StoreU(hn::Mul(hn::ConvertTo(d, hi), scale), d, o + kGroup / 2);
        }
      }
      return;
    }
    case KvDtype::kFP8:
    case KvDtype::kInt3:
    case KvDtype::kInt2:
      break;
  }
  std::fill_n(out, dd, std::numeric_limits<float>::quiet_NaN());
}

// Where a KV tile's rows are read from, vector c of row t at a time: a
// decoded f32 tile, or the cache rows in place for the float dtypes
// (converted in registers). Both give the same values, so which one a tile
// uses does not change a bit of the result.
struct TileRows {
  const float* p;
  int64_t stride;  // floats between rows
  HWY_INLINE hn::Vec<DF> Load(int t, int c) const {
    const DF d;
    return hn::LoadU(d, p + t * stride + c * hn::Lanes(d));
  }
};
template <typename T>  // float, hwy::float16_t or hwy::bfloat16_t
struct CacheRows {
  const std::byte* plane;
  const int64_t* offsets;  // of the tile's rows in the plane
  HWY_INLINE hn::Vec<DF> Load(int t, int c) const {
    const DF d;
    const T* p =
        reinterpret_cast<const T*>(plane + offsets[t]) + c * hn::Lanes(d);
    if constexpr (std::is_same_v<T, float>) {
      return hn::LoadU(d, p);
    } else {
      return hn::PromoteTo(d, hn::LoadU(hn::Rebind<T, DF>(), p));
    }
  }
};

// The fp16 scale of a quantized group, as DecodeRow reads it (the
// conversion is exact, so the hardware one gives the same value).
HWY_INLINE float GroupScale(const std::byte* b) {
  uint16_t h;
  std::memcpy(&h, b, 2);
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return cpu::HalfToFloat(h);
#endif
}

// q8_0 / q4_0 rows in place: vector c of a row lies inside one group of
// kGroup elements (lanes divide 16), scaled as DecodeRow scales it.
struct Int8Rows {
  const std::byte* plane;
  const int64_t* offsets;
  HWY_INLINE hn::Vec<DF> Load(int t, int c) const {
    const DF d;
    const int e = c * static_cast<int>(hn::Lanes(d));
    const std::byte* b = plane + offsets[t] + e / kGroup * (kGroup + 2);
    const auto* q = reinterpret_cast<const int8_t*>(b + 2) + e % kGroup;
    const auto v =
        hn::ConvertTo(d, hn::PromoteTo(hn::RebindToSigned<DF>(),
                                       hn::LoadU(hn::Rebind<int8_t, DF>(), q)));
    return hn::Mul(v, hn::Set(d, GroupScale(b)));
  }
};
struct Int4Rows {
  const std::byte* plane;
  const int64_t* offsets;
  HWY_INLINE hn::Vec<DF> Load(int t, int c) const {
    const DF d;
    const hn::RebindToSigned<DF> di;
    const int e = c * static_cast<int>(hn::Lanes(d));
    const std::byte* b = plane + offsets[t] + e / kGroup * (kGroup / 2 + 2);
    const int j = e % kGroup;  // elements j < 16: low nibbles of byte j
    const auto* qs = reinterpret_cast<const uint8_t*>(b + 2) + j % (kGroup / 2);
    const auto bytes = hn::BitCast(
        di, hn::PromoteTo(hn::RebindToUnsigned<DF>(),
                          hn::LoadU(hn::Rebind<uint8_t, DF>(), qs)));
    const auto nib = j < kGroup / 2 ? hn::And(bytes, hn::Set(di, 0xf))
                                    : hn::ShiftRight<4>(bytes);
    return hn::Mul(hn::ConvertTo(d, hn::Sub(nib, hn::Set(di, 8))),
                   hn::Set(d, GroupScale(b)));
  }
};

// Whether int3/int2 rows of dd elements decode a lane vector at a time: a
// vector lies in one two-bit plane and, for int3, starts on a byte of the
// high-bit mask (lanes divide 16, so it also lies in one value group).
HWY_INLINE bool LowBitVectors(int bits, int dd) {
  const int lanes = static_cast<int>(hn::Lanes(DF()));
  return (dd / 4) % lanes == 0 && (bits == 2 || lanes % 8 == 0) &&
         kvcache::kKvLowBitGroup % lanes == 0;
}

// The codes of elements [e, e + lanes) of a low-bit row (LowBitVectors).
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> LowBitCodeVec(int bits,
                                                         const std::byte* codes,
                                                         int dd, int e) {
  const hn::RebindToSigned<DF> di;
  const int quarter = dd / 4;
  const auto* lo = reinterpret_cast<const uint8_t*>(codes);
  const auto bytes = hn::BitCast(
      di,
      hn::PromoteTo(hn::RebindToUnsigned<DF>(),
                    hn::LoadU(hn::Rebind<uint8_t, DF>(), lo + e % quarter)));
  auto q =
      hn::And(hn::ShiftRightSame(bytes, 2 * (e / quarter)), hn::Set(di, 3));
  if (bits == 3) {
    q = hn::Or(q, hn::IfThenElseZero(hn::LoadMaskBits(di, lo + quarter + e / 8),
                                     hn::Set(di, 4)));
  }
  return q;
}

// A key row of int3/int2 into out[0, dd): code[e] * scale[e] + min[e] (one
// FMA, as the scalar decoders compute it), the group's per-channel scales.
HWY_INLINE void DecodeLowBitKeyRow(int bits, const std::byte* codes, int dd,
                                   const float* scale, const float* min,
                                   float* out) {
  const DF d;
  if (LowBitVectors(bits, dd)) {
    const int lanes = static_cast<int>(hn::Lanes(d));
    for (int e = 0; e < dd; e += lanes) {
      hn::StoreU(hn::MulAdd(hn::ConvertTo(d, LowBitCodeVec(bits, codes, dd, e)),
                            hn::LoadU(d, scale + e), hn::LoadU(d, min + e)),
                 d, out + e);
    }
    return;
  }
  for (int e = 0; e < dd; ++e) {
    out[e] = std::fma(static_cast<float>(cpu::LowBitCode(codes, bits, dd, e)),
                      scale[e], min[e]);
  }
}

// A value row of int3/int2 into out[0, dd): each group's scale and min
// broadcast from the row's own pairs.
HWY_INLINE void DecodeLowBitValueRow(int bits, const std::byte* row, int dd,
                                     float* out) {
  constexpr int kG = kvcache::kKvLowBitGroup;
  const DF d;
  const std::byte* meta = row + dd * bits / 8;
  if (LowBitVectors(bits, dd)) {
    const int lanes = static_cast<int>(hn::Lanes(d));
    for (int g = 0; g < dd / kG; ++g) {
      const auto scale = hn::Set(d, GroupScale(meta + 4 * g));
      const auto min = hn::Set(d, GroupScale(meta + 4 * g + 2));
      for (int e = g * kG; e < (g + 1) * kG; e += lanes) {
        hn::StoreU(hn::MulAdd(hn::ConvertTo(d, LowBitCodeVec(bits, row, dd, e)),
                              scale, min),
                   d, out + e);
      }
    }
    return;
  }
  for (int e = 0; e < dd; ++e) {
    out[e] = std::fma(static_cast<float>(cpu::LowBitCode(row, bits, dd, e)),
                      GroupScale(meta + 4 * (e / kG)),
                      GroupScale(meta + 4 * (e / kG) + 2));
  }
}

// A key group's per-channel scales and mins (row r of the group holds
// channels [r * dd / 32, (r + 1) * dd / 32)), as DecodeKvKeyScales.
HWY_INLINE void LowBitKeyScales(int bits, const std::byte* group,
                                int64_t stride, int dd, float* scale,
                                float* min) {
  const int per_row = dd / kvcache::kKvKeyGroupTokens;
  const int64_t meta = dd * bits / 8;
  for (int r = 0; r < kvcache::kKvKeyGroupTokens; ++r) {
    const std::byte* m = group + r * stride + meta;
    for (int i = 0; i < per_row; ++i) {
      scale[r * per_row + i] = GroupScale(m + 4 * i);
      min[r * per_row + i] = GroupScale(m + 4 * i + 2);
    }
  }
}

// Largest head_dim the low-bit tile decoder takes (its scales on the
// stack); CheckKvDtypeShape refuses larger ones.
inline constexpr int kMaxLowBitDim = kvcache::kKvLowBitMaxHeadDim;

// Decodes int3/int2 rows at plane + rows[0, n), the KV positions t0 ..
// t0 + n - 1, into a tile of rows `dp` floats apart. A value row carries
// its own scales; a key row's come from its key group, whose first row is
// (t0 + t) % 32 slots (slot_bytes apart) before it in the same block.
inline void DecodeLowBitTile(KvDtype dtype, bool keys, const std::byte* plane,
                             const int64_t* rows, int32_t t0, int n, int dd,
                             int dp, int64_t slot_bytes, float* out) {
  constexpr int kTokens = kvcache::kKvKeyGroupTokens;
  const int bits = kvcache::KvLowBits(dtype);
  HWY_ALIGN float scale[kMaxLowBitDim], min[kMaxLowBitDim];
  int32_t group = -1;
  for (int t = 0; t < n; ++t) {
    const std::byte* row = plane + rows[t];
    float* o = out + static_cast<int64_t>(t) * dp;
    if (!keys) {
      DecodeLowBitValueRow(bits, row, dd, o);
      continue;
    }
    const int32_t pos = t0 + t;
    if (pos / kTokens != group) {
      group = pos / kTokens;
      LowBitKeyScales(bits, row - (pos % kTokens) * slot_bytes, slot_bytes, dd,
                      scale, min);
    }
    DecodeLowBitKeyRow(bits, row, dd, scale, min, o);
  }
}

// Replaces the rows of a decoded low-bit tile (KV head h; tile row t at
// plane offset rows[t], slot_bytes per slot) that belong to key groups the
// forward writes with their full-precision rows (cpu::KvResidual, KIVI's
// residual). Only rows from `from` on can be staged: the sequence's first
// new position, rounded down to its group.
inline void OverlayResidualRows(const cpu::KvResidual& residual, int layer,
                                const int64_t* rows, int from, int n,
                                int64_t slot_bytes, int h, int dd, int kv_dim,
                                int dp, float* k, float* v) {
  constexpr int kTokens = kvcache::kKvKeyGroupTokens;
  for (int t = std::max(from, 0); t < n;) {
    const int64_t slot = rows[t] / slot_bytes;
    const int row = static_cast<int>(slot % kTokens);
    const int len = std::min(n - t, kTokens - row);
    int valid = 0;
    const float* base = residual.Rows(slot / kTokens, layer, &valid);
    for (int j = 0; base != nullptr && j < len && row + j < valid; ++j) {
      const float* kr = base + (row + j) * kv_dim + h * dd;
      std::memcpy(k + static_cast<int64_t>(t + j) * dp, kr, sizeof(float) * dd);
      std::memcpy(v + static_cast<int64_t>(t + j) * dp, kr + kTokens * kv_dim,
                  sizeof(float) * dd);
    }
    t += len;
  }
}

// Decodes the KV rows at plane + rows[0, n) into a tile of rows `dp`
// floats apart.
template <KvDtype kDtype>
void DecodeTileAs(const std::byte* plane, const int64_t* rows, int n, int dd,
                  int dp, float* out) {
  for (int t = 0; t < n; ++t) {
    DecodeRow(kDtype, plane + rows[t], dd, out + static_cast<int64_t>(t) * dp);
  }
}
inline void DecodeTile(KvDtype dtype, const std::byte* plane,
                       const int64_t* rows, int n, int dd, int dp, float* out) {
  switch (dtype) {
    case KvDtype::kF32:
      return DecodeTileAs<KvDtype::kF32>(plane, rows, n, dd, dp, out);
    case KvDtype::kF16:
      return DecodeTileAs<KvDtype::kF16>(plane, rows, n, dd, dp, out);
    case KvDtype::kBF16:
      return DecodeTileAs<KvDtype::kBF16>(plane, rows, n, dd, dp, out);
    case KvDtype::kInt8:
      return DecodeTileAs<KvDtype::kInt8>(plane, rows, n, dd, dp, out);
    case KvDtype::kInt4:
      return DecodeTileAs<KvDtype::kInt4>(plane, rows, n, dd, dp, out);
    case KvDtype::kFP8:
    case KvDtype::kInt3:  // DecodeLowBitTile: rows need their positions
    case KvDtype::kInt2:
      return DecodeTileAs<KvDtype::kFP8>(plane, rows, n, dd, dp, out);
  }
}

}  // namespace kvserve::models::cpu_attn
