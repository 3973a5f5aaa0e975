// The KV row formats of models/cpu/kv_rows.h read with Highway vectors, for
// the CPU attention kernel (models/cpu/paged_attention.cc, its only
// includer, which defines HWY_COMPILE_ONLY_STATIC and includes Highway
// first): whole rows decoded into an f32 tile, and "row sources" that load
// vector c of a tile's row t either from such a tile or from the cache in
// place, converting in registers. Every path gives the values DecodeKvRow
// gives, so which one the kernel uses never changes a bit of its result.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#ifdef __F16C__
#include <immintrin.h>
#endif

#include "kvcache/kv_sizing.h"
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
      return DecodeTileAs<KvDtype::kFP8>(plane, rows, n, dd, dp, out);
  }
}

}  // namespace kvserve::models::cpu_attn
