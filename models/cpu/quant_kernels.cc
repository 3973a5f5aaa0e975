// NOTE: GCC 12 reports false (maybe-)uninitialized warnings inside its AVX-512
// intrinsic headers (GCC bug 105593); this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "models/cpu/quant_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "common/parallel.h"
#include "models/quant_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KVSERVE_QUANT_VNNI 1
#include <immintrin.h>
#endif

namespace kvserve::models::cpu::internal {
namespace {

// Unused where the AVX-512 kernels (their only callers) are compiled out.
[[maybe_unused]] bool SmallTilesToL1() {
  return small_tiles_to_l1.load(std::memory_order_relaxed);
}

// Activation rows sharing one pass over a weight tile.
constexpr int kMaxMr = 8;
static_assert(kMaxMr == kBiasedActsRows,
              "batches of more than one pass read the biased activations");

#ifdef KVSERVE_QUANT_VNNI
void QuantizeRowAvx512(const float* x, int64_t nb, int per, int8_t* q,
                       ActScale* sc) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b0 = 0; b0 < nb; b0 += per) {
    __m512 ax = _mm512_setzero_ps();
    for (int64_t j = b0 * kQBlock; j < (b0 + per) * kQBlock; j += 16) {
      ax = _mm512_max_ps(ax, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + j)));
    }
    const float amax = _mm512_reduce_max_ps(ax);
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    for (int64_t b = b0; b < b0 + per; ++b) {
      const __m512i q0 = _mm512_cvtps_epi32(
          _mm512_mul_ps(_mm512_loadu_ps(x + b * kQBlock), id));
      const __m512i q1 = _mm512_cvtps_epi32(
          _mm512_mul_ps(_mm512_loadu_ps(x + b * kQBlock + 16), id));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQBlock),
                       _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQBlock + 16),
                       _mm512_cvtsepi32_epi8(q1));
      const int lo = _mm512_reduce_add_epi32(q0);
      const int hi = _mm512_reduce_add_epi32(q1);
      sc[b] = {d, d * static_cast<float>(lo + hi), static_cast<int16_t>(lo),
               static_cast<int16_t>(hi)};
    }
  }
}

// q + 128 as unsigned bytes (cols a multiple of 32).
void BiasRowAvx512(const int8_t* q, int64_t cols, uint8_t* out) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = 0; j < cols; j += 32) {
    const __m256i v =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + j));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j),
                        _mm256_xor_si256(v, flip));
  }
}

inline __m512i Bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Software prefetch of the same block one tile ahead: the hardware streamer
// alone leaves weights from L3/DRAM poorly overlapped with the VNNI work
// (measured 2.2x on a cold 30-layer decode sweep, 1.9x on 4096x4096). Small
// tiles go to L1; tiles over 16 KiB (long rows) to L2, where they still fit.
// NOTE: always_inline is load-bearing: GCC 12 finds a helper that only
// prefetches side-effect free ("const") and deletes the call otherwise.
struct TilePrefetch {
  int64_t dist;  // bytes: one tile
  bool to_l1;

  explicit TilePrefetch(const QuantTiles& w)
      : dist(static_cast<int64_t>(w.tile_stride)),
        to_l1(w.tile_stride <= kSmallTileBytes && SmallTilesToL1()) {}
  // Four cache lines from p + dist.
  [[gnu::always_inline]] inline void Lines4(const void* p) const {
    const char* c = static_cast<const char*>(p) + dist;
    if (to_l1) {
      _mm_prefetch(c, _MM_HINT_T0);
      _mm_prefetch(c + 64, _MM_HINT_T0);
      _mm_prefetch(c + 128, _MM_HINT_T0);
      _mm_prefetch(c + 192, _MM_HINT_T0);
    } else {
      _mm_prefetch(c, _MM_HINT_T1);
      _mm_prefetch(c + 64, _MM_HINT_T1);
      _mm_prefetch(c + 128, _MM_HINT_T1);
      _mm_prefetch(c + 192, _MM_HINT_T1);
    }
  }
  // One cache line from p + dist.
  [[gnu::always_inline]] inline void Line(const void* p) const {
    const char* c = static_cast<const char*>(p) + dist;
    if (to_l1) {
      _mm_prefetch(c, _MM_HINT_T0);
    } else {
      _mm_prefetch(c, _MM_HINT_T1);
    }
  }
};

// Writes the accumulators of tile t for activation rows [i0, i0 + kMr): one
// lane per weight row, the rows past the matrix's end masked off.
template <int kMr>
[[gnu::always_inline]] inline void StoreTileRows(const QuantTiles& w, int64_t t,
                                                 int64_t i0, const __m512* acc,
                                                 float* y) {
  const int64_t valid = std::min<int64_t>(kTileRows, w.rows - t * kTileRows);
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) {
    _mm512_mask_storeu_ps(
        y + (i0 + r) * w.out_stride + w.out_offset + t * kTileRows, mask,
        acc[r]);
  }
}

// The IQ4 code book + 128, as unsigned bytes for VPDPBUSD.
alignas(16) constexpr std::array<uint8_t, 16> kIq4Biased = [] {
  std::array<uint8_t, 16> t{};
  for (int i = 0; i < 16; ++i) {
    t[i] = static_cast<uint8_t>(kIq4NlValues[i] + 128);
  }
  return t;
}();

// The quants of block `qb` of a nibble kind as unsigned bytes, for the
// VPDPBUSD of elements [4g, 4g + 4) (lo) and [16 + 4g, 16 + 4g + 4) (hi) of
// the 16 rows: nibbles, bit planes added under their masks, or IQ4 code-book
// values + 128 looked up in a register.
template <QuantKind kKind>
[[gnu::always_inline]] inline void UnpackNibbles(const uint8_t* qb, __m512i* lo,
                                                 __m512i* hi) {
  constexpr NibbleSpec kS = SpecOf(kKind);
  const __m512i field = _mm512_set1_epi8((1 << kS.base) - 1);
  __m512i v0 = _mm512_setzero_si512(), v1 = _mm512_setzero_si512();
  if constexpr (kS.base == 2) {
    v0 = _mm512_load_si512(qb);
    v1 = _mm512_load_si512(qb + 64);
  }
#pragma GCC unroll 8
  for (int g = 0; g < 4; ++g) {
    if constexpr (kS.base == 4) {
      const __m512i v = _mm512_load_si512(qb + g * 64);
      lo[g] = _mm512_and_si512(v, field);
      hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), field);
    } else {
      lo[g] = _mm512_and_si512(_mm512_srli_epi16(v0, 2 * g), field);
      hi[g] = _mm512_and_si512(_mm512_srli_epi16(v1, 2 * g), field);
    }
#pragma GCC unroll 2
    for (int p = 0; p < kS.planes; ++p) {
      const __m512i bit =
          _mm512_set1_epi8(static_cast<char>(1 << (kS.base + p)));
      const uint8_t* m = qb + 64 * kS.base + 64 * p;
      uint64_t mlo, mhi;
      std::memcpy(&mlo, m + 8 * g, 8);
      std::memcpy(&mhi, m + 8 * (4 + g), 8);
      lo[g] = _mm512_mask_add_epi8(lo[g], _cvtu64_mask64(mlo), lo[g], bit);
      hi[g] = _mm512_mask_add_epi8(hi[g], _cvtu64_mask64(mhi), hi[g], bit);
    }
    if constexpr (kS.lut) {
      const __m512i lut = _mm512_broadcast_i32x4(
          _mm_load_si128(reinterpret_cast<const __m128i*>(kIq4Biased.data())));
      lo[g] = _mm512_shuffle_epi8(lut, lo[g]);
      hi[g] = _mm512_shuffle_epi8(lut, hi[g]);
    }
  }
}

// A tile's blocks unpacked once (DecodeTile) for the passes of a large
// batch: per block the 8 vectors UnpackNibbles gives, lo then hi. The K
// kinds with a zero point (Q3_K, Q6_K, IQ4_XS) are stored signed (u - zero)
// and followed by 16 int32, the block's bias (DecodeSignedTileAs).
constexpr int64_t kDecodedBlock = 512;

// True for the kinds whose unpacked tiles hold signed values.
constexpr bool SignedDecode(const NibbleSpec& s) {
  return s.super && s.zero != 0;
}

constexpr int64_t DecodedStride(const NibbleSpec& s) {
  return kDecodedBlock + (SignedDecode(s) ? 64 : 0);
}

[[gnu::always_inline]] inline void LoadDecoded(const uint8_t* p, __m512i* lo,
                                               __m512i* hi) {
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    lo[g] = _mm512_load_si512(p + g * 64);
    hi[g] = _mm512_load_si512(p + 256 + g * 64);
  }
}

template <QuantKind kKind>
void DecodeTileAs(const QuantTiles& w, int64_t t, uint8_t* out) {
  constexpr int64_t kQBytes = SpecOf(kKind).QuantBytes();
  const uint8_t* tile = w.Tile(t);
  for (int64_t b = 0; b < w.nb; ++b) {
    __m512i lo[4], hi[4];
    UnpackNibbles<kKind>(tile + b * kQBytes, lo, hi);
    uint8_t* o = out + b * kDecodedBlock;
    for (int g = 0; g < 4; ++g) {
      _mm512_store_si512(o + g * 64, lo[g]);
      _mm512_store_si512(o + 256 + g * 64, hi[g]);
    }
  }
}

// One 16-row tile x kMr activation rows for the nibble kinds with an fp16
// scale per 32 (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): per block, unpack the
// quants once and run 8 VPDPBUSD per activation row; the int32 block sums
// are scaled into fp32 accumulators (one lane per weight row).
template <QuantKind kKind, int kMr>
void NibbleTileAvx512(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                      int64_t i0, const uint8_t* decoded, float* y) {
  constexpr NibbleSpec kS = SpecOf(kKind);
  // sum (u - zero) a = dot - zero sum(a).
  constexpr auto kZero = static_cast<float>(kS.zero);
  constexpr int64_t kQBytes = kS.QuantBytes();
  const int64_t nb = w.nb;
  const uint8_t* tile = w.Tile(t);
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(tile + nb * kQBytes);
  const uint16_t* ms = ds + nb * kTileRows;
  const TilePrefetch prefetch(w);
  __m512 acc[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qb = tile + b * kQBytes;
    prefetch.Lines4(qb);
    if constexpr (kQBytes > 256) prefetch.Line(qb + 256);
    prefetch.Line(ds + b * kTileRows);
    if constexpr (kS.mins) prefetch.Line(ms + b * kTileRows);
    __m512i lo[4], hi[4];
    if (decoded != nullptr) {
      LoadDecoded(decoded + b * kDecodedBlock, lo, hi);
    } else {
      UnpackNibbles<kKind>(qb, lo, hi);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(
        reinterpret_cast<const __m256i*>(ds + b * kTileRows)));
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const int8_t* aq = a.Row(i0 + r) + b * kQBlock;
      const ActScale& sc = a.Scales(i0 + r)[b];
      __m512i s0 = _mm512_setzero_si512();
      __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < 4; ++g) {
        s0 = _mm512_dpbusd_epi32(s0, lo[g], Bcast4(aq + 4 * g));
        s1 = _mm512_dpbusd_epi32(s1, hi[g], Bcast4(aq + 16 + 4 * g));
      }
      const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      if constexpr (!kS.mins) {
        const __m512 v = _mm512_fmadd_ps(f, _mm512_set1_ps(sc.d),
                                         _mm512_set1_ps(-kZero * sc.s));
        acc[r] = _mm512_fmadd_ps(v, dw, acc[r]);
      } else {
        const __m512 mw = _mm512_cvtph_ps(_mm256_load_si256(
            reinterpret_cast<const __m256i*>(ms + b * kTileRows)));
        acc[r] =
            _mm512_fmadd_ps(_mm512_mul_ps(f, _mm512_set1_ps(sc.d)), dw, acc[r]);
        acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sc.s), acc[r]);
      }
    }
  }
  StoreTileRows<kMr>(w, t, i0, acc, y);
}

// 16 int8 (or u8) per-row values at p as fp32 lanes.
[[gnu::always_inline]] inline __m512 RowInts(const void* p, bool is_signed) {
  const __m128i v = _mm_load_si128(static_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(v)
                                      : _mm512_cvtepu8_epi32(v));
}

// Block b's integer sub-scales per row lane and scale group h, the pairs
// (-zero * sub_0, -zero * sub_1) as int16 for the zero-point term (one
// VPDPWSSD against the activations' sum pair), and dmin * min per group.
template <QuantKind kKind>
struct SuperBlock {
  static constexpr NibbleSpec kS = SpecOf(kKind);
  __m512i sub[kS.halves];
  __m512i zero_pair;
  __m512 mm[kS.halves];

  [[gnu::always_inline]] inline SuperBlock(const SuperLayout& L, int64_t b,
                                           __m512 dmin) {
    if constexpr (kS.sub6) {
      Sub6(L.subs + b * kS.SubBytes());
    } else {
      SubBytes(L, b, dmin);
    }
    if constexpr (kS.zero != 0) {
      const __m512i z = _mm512_set1_epi32(-kS.zero);
      const __m512i lo = _mm512_mullo_epi32(sub[0], z);
      const __m512i hi = _mm512_mullo_epi32(sub[kS.halves - 1], z);
      zero_pair =
          _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xffff)),
                          _mm512_slli_epi32(hi, 16));
    }
  }

  // A byte per row and group: int8 sub-scales and u8 mins, or (packed) a
  // 4-bit sub-scale and min in one.
  [[gnu::always_inline]] inline void SubBytes(const SuperLayout& L, int64_t b,
                                              __m512 dmin) {
#pragma GCC unroll 2
    for (int h = 0; h < kS.halves; ++h) {
      const int64_t at = (b * kS.halves + h) * kTileRows;
      const __m128i bytes =
          _mm_load_si128(reinterpret_cast<const __m128i*>(L.subs + at));
      if constexpr (kS.packed) {
        const __m512i v = _mm512_cvtepu8_epi32(bytes);
        sub[h] = _mm512_and_si512(v, _mm512_set1_epi32(15));
        mm[h] =
            _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4)), dmin);
      } else {
        sub[h] = _mm512_cvtepi8_epi32(bytes);
        if constexpr (kS.mins) {
          mm[h] = _mm512_mul_ps(RowInts(L.mins + at, false), dmin);
        }
      }
    }
  }

  // sub6 (matmul_internal.h): the low nibbles of both halves, then per half
  // the row's 2 high bits out of a 32-bit word; stored + 32.
  [[gnu::always_inline]] inline void Sub6(const int8_t* p) {
    const __m512i nib = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i shifts = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14,
                                            12, 10, 8, 6, 4, 2, 0);
    const __m512i fifteen = _mm512_set1_epi32(15);
    const __m512i three = _mm512_set1_epi32(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      int32_t word;
      std::memcpy(&word, p + 16 + 4 * h, 4);
      const __m512i high = _mm512_and_si512(
          _mm512_srlv_epi32(_mm512_set1_epi32(word), shifts), three);
      const __m512i low =
          _mm512_and_si512(_mm512_srli_epi32(nib, 4 * h), fifteen);
      sub[h] =
          _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)),
                           _mm512_set1_epi32(32));
    }
  }

  // One activation row's block: each scale group's exact int32 dot times
  // its sub-scale, and the zero point's term, into isum; the mins' term
  // into acc.
  [[gnu::always_inline]] inline void Row(const __m512i* lo, const __m512i* hi,
                                         const int8_t* aq, const ActScale& sc,
                                         __m512i* isum, __m512* acc) const {
    __m512i s0 = _mm512_setzero_si512();
    __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int g = 0; g < 4; ++g) {
      s0 = _mm512_dpbusd_epi32(s0, lo[g], Bcast4(aq + 4 * g));
      if constexpr (kS.halves == 1) {
        s0 = _mm512_dpbusd_epi32(s0, hi[g], Bcast4(aq + 16 + 4 * g));
      } else {
        s1 = _mm512_dpbusd_epi32(s1, hi[g], Bcast4(aq + 16 + 4 * g));
      }
    }
    __m512i v = _mm512_mullo_epi32(s0, sub[0]);
    if constexpr (kS.halves == 2) {
      v = _mm512_add_epi32(v, _mm512_mullo_epi32(s1, sub[1]));
    }
    *isum = _mm512_add_epi32(*isum, v);
    if constexpr (kS.zero != 0) {
      *isum = _mm512_dpwssd_epi32(
          *isum, zero_pair,
          Bcast4(reinterpret_cast<const int8_t*>(&sc.sum_lo)));
    }
    if constexpr (kS.mins && kS.halves == 1) {
      *acc = _mm512_fnmadd_ps(mm[0], _mm512_set1_ps(sc.s), *acc);
    } else if constexpr (kS.mins) {
      *acc = _mm512_fnmadd_ps(
          mm[0], _mm512_set1_ps(static_cast<float>(sc.sum_lo) * sc.d), *acc);
      *acc = _mm512_fnmadd_ps(
          mm[1], _mm512_set1_ps(static_cast<float>(sc.sum_hi) * sc.d), *acc);
    }
  }

  // Row against signed unpacked values (SignedDecode) and the activations
  // + 128 (`ab`): no zero-point term; the bias is in isum's start.
  [[gnu::always_inline]] inline void RowSigned(const __m512i* lo,
                                               const __m512i* hi,
                                               const uint8_t* ab,
                                               __m512i* isum) const {
    __m512i s0 = _mm512_setzero_si512();
    __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int g = 0; g < 4; ++g) {
      s0 = _mm512_dpbusd_epi32(s0, Bcast4(ab + 4 * g), lo[g]);
      if constexpr (kS.halves == 1) {
        s0 = _mm512_dpbusd_epi32(s0, Bcast4(ab + 16 + 4 * g), hi[g]);
      } else {
        s1 = _mm512_dpbusd_epi32(s1, Bcast4(ab + 16 + 4 * g), hi[g]);
      }
    }
    __m512i v = _mm512_mullo_epi32(s0, sub[0]);
    if constexpr (kS.halves == 2) {
      v = _mm512_add_epi32(v, _mm512_mullo_epi32(s1, sub[1]));
    }
    *isum = _mm512_add_epi32(*isum, v);
  }
};

// The SignedDecode kinds unpacked for a large batch: v = u - zero, then per
// block and row the bias 128 * sum_h sub_h * sum(v in group h), since
// sum (a + 128) v = sum a v + 128 sum v. The zero point's term thus leaves
// the per-row work (a Q6_K GEMM of 32 rows: -8%). Exact integers: the sums
// equal the packed kernel's, so a row's result stays batch-invariant.
template <QuantKind kKind>
void DecodeSignedTileAs(const QuantTiles& w, int64_t t, uint8_t* out) {
  constexpr NibbleSpec kS = SpecOf(kKind);
  static_assert(SignedDecode(kS));
  constexpr int64_t kQBytes = kS.QuantBytes();
  const uint8_t* tile = w.Tile(t);
  const SuperLayout L = SuperOf(w, kS, tile);
  const __m512i zero = _mm512_set1_epi8(static_cast<char>(kS.zero));
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t b = 0; b < w.nb; ++b) {
    __m512i lo[4], hi[4];
    UnpackNibbles<kKind>(tile + b * kQBytes, lo, hi);
    const SuperBlock<kKind> sb(L, b, _mm512_setzero_ps());
    uint8_t* o = out + b * DecodedStride(kS);
    __m512i s0 = _mm512_setzero_si512();
    __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      lo[g] = _mm512_sub_epi8(lo[g], zero);
      hi[g] = _mm512_sub_epi8(hi[g], zero);
      _mm512_store_si512(o + g * 64, lo[g]);
      _mm512_store_si512(o + 256 + g * 64, hi[g]);
      s0 = _mm512_dpbusd_epi32(s0, ones, lo[g]);
      s1 = _mm512_dpbusd_epi32(s1, ones, hi[g]);
    }
    __m512i bias;
    if constexpr (kS.halves == 1) {
      bias = _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), sb.sub[0]);
    } else {
      bias = _mm512_add_epi32(_mm512_mullo_epi32(s0, sb.sub[0]),
                              _mm512_mullo_epi32(s1, sb.sub[1]));
    }
    _mm512_store_si512(o + kDecodedBlock, _mm512_slli_epi32(bias, 7));
  }
}

// The K kinds, as llama.cpp's Q8_K dot products: per activation row, the
// exact int32 dot of each scale group times its integer sub-scale, summed
// over a 256-block (|sum| < 2^29 for every kind), then one conversion
// times d (per row) * the activations' scale; the mins' term per block in
// fp32.
// kSigned: `decoded` holds the tile unpacked by DecodeSignedTileAs, and the
// activations are read + 128.
template <QuantKind kKind, int kMr, bool kSigned = false>
void SuperTileAvx512(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                     int64_t i0, const uint8_t* decoded, float* y) {
  constexpr NibbleSpec kS = SpecOf(kKind);
  static_assert(!kSigned || SignedDecode(kS));
  constexpr int kH = kS.halves;
  constexpr int64_t kQBytes = kS.QuantBytes();
  constexpr int64_t kStride = DecodedStride(kS);
  const uint8_t* tile = w.Tile(t);
  const SuperLayout L = SuperOf(w, kS, tile);
  const TilePrefetch prefetch(w);
  __m512 acc[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) acc[r] = _mm512_setzero_ps();
  __m512 dmin = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < w.nb; b0 += 8) {
    if constexpr (kS.mins) {
      dmin = _mm512_cvtph_ps(_mm256_load_si256(
          reinterpret_cast<const __m256i*>(L.dmin + b0 / 8 * kTileRows)));
    }
    // The signed unpacking's bias, subtracted once per 256.
    __m512i start = _mm512_setzero_si512();
    if constexpr (kSigned) {
      for (int64_t b = b0; b < b0 + 8; ++b) {
        start = _mm512_sub_epi32(
            start, _mm512_load_si512(decoded + b * kStride + kDecodedBlock));
      }
    }
    __m512i isum[kMr];
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) isum[r] = start;
    for (int64_t b = b0; b < b0 + 8; ++b) {
      // Also with `decoded`: these lines of the next tile serve its unpacking.
      const uint8_t* qb = tile + b * kQBytes;
      prefetch.Lines4(qb);  // 256 bytes: all of a 2-bit kind's quants
      if constexpr (kQBytes > 256) prefetch.Line(qb + 256);
      if constexpr (kQBytes > 320) prefetch.Line(qb + 320);
      prefetch.Line(L.subs + b * kS.SubBytes());
      if constexpr (kS.mins && !kS.packed) {
        prefetch.Line(L.mins + b * kH * kTileRows);
      }
      __m512i lo[4], hi[4];
      if (decoded != nullptr) {
        LoadDecoded(decoded + b * kStride, lo, hi);
      } else {
        UnpackNibbles<kKind>(qb, lo, hi);
      }
      const SuperBlock<kKind> sb(L, b, dmin);
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
        if constexpr (kSigned) {
          sb.RowSigned(lo, hi, a.BiasedRow(i0 + r) + b * kQBlock, &isum[r]);
        } else {
          sb.Row(lo, hi, a.Row(i0 + r) + b * kQBlock, a.Scales(i0 + r)[b],
                 &isum[r], &acc[r]);
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(
        reinterpret_cast<const __m256i*>(L.d + b0 / 8 * kTileRows)));
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const __m512 ad = _mm512_set1_ps(a.Scales(i0 + r)[b0].d);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]),
                               _mm512_mul_ps(d, ad), acc[r]);
    }
  }
  StoreTileRows<kMr>(w, t, i0, acc, y);
}

// Q8_0: weights stored as q + 128 (unsigned), so sum q a = dot - 128 sum(a).
template <int kMr>
void Q8TileAvx512(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                  int64_t i0, float* y) {
  const int64_t nb = w.nb;
  const uint8_t* tile = w.Tile(t);
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(tile + nb * 512);
  const TilePrefetch prefetch(w);
  __m512 acc[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qb = tile + b * 512;
    prefetch.Lines4(qb);
    prefetch.Lines4(qb + 256);
    prefetch.Line(ds + b * kTileRows);
    __m512i wq[8];
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) wq[g] = _mm512_load_si512(qb + g * 64);
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(
        reinterpret_cast<const __m256i*>(ds + b * kTileRows)));
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const int8_t* aq = a.Row(i0 + r) + b * kQBlock;
      const ActScale& sc = a.Scales(i0 + r)[b];
      __m512i s0 = _mm512_setzero_si512();
      __m512i s1 = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int g = 0; g < 8; g += 2) {
        s0 = _mm512_dpbusd_epi32(s0, wq[g], Bcast4(aq + 4 * g));
        s1 = _mm512_dpbusd_epi32(s1, wq[g + 1], Bcast4(aq + 4 * g + 4));
      }
      const __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      const __m512 v = _mm512_fmadd_ps(f, _mm512_set1_ps(sc.d),
                                       _mm512_set1_ps(-128.0f * sc.s));
      acc[r] = _mm512_fmadd_ps(v, dw, acc[r]);
    }
  }
  StoreTileRows<kMr>(w, t, i0, acc, y);
}

// A K kind's tile: the signed passes where the tile was unpacked signed.
template <QuantKind kKind, int kMr>
void SuperTile(const QuantTiles& w, int64_t t, const QuantizedActs& a,
               int64_t i0, const uint8_t* decoded, float* y) {
  if constexpr (SignedDecode(SpecOf(kKind))) {
    if (decoded != nullptr) {
      return SuperTileAvx512<kKind, kMr, true>(w, t, a, i0, decoded, y);
    }
  }
  SuperTileAvx512<kKind, kMr>(w, t, a, i0, decoded, y);
}

// The nibble kinds' tile t unpacked into `out` (w.nb * kDecodedBlock
// bytes); false for Q8_0, whose bytes need no unpacking.
bool DecodeTile(const QuantTiles& w, int64_t t, uint8_t* out) {
  switch (w.kind) {
    case QuantKind::kQ4_0:
      return DecodeTileAs<QuantKind::kQ4_0>(w, t, out), true;
    case QuantKind::kQ4_1:
      return DecodeTileAs<QuantKind::kQ4_1>(w, t, out), true;
    case QuantKind::kQ5_0:
      return DecodeTileAs<QuantKind::kQ5_0>(w, t, out), true;
    case QuantKind::kQ5_1:
      return DecodeTileAs<QuantKind::kQ5_1>(w, t, out), true;
    case QuantKind::kIQ4_NL:
      return DecodeTileAs<QuantKind::kIQ4_NL>(w, t, out), true;
    case QuantKind::kQ2_K:
      return DecodeTileAs<QuantKind::kQ2_K>(w, t, out), true;
    case QuantKind::kQ3_K:
      return DecodeSignedTileAs<QuantKind::kQ3_K>(w, t, out), true;
    case QuantKind::kQ4_K:
      return DecodeTileAs<QuantKind::kQ4_K>(w, t, out), true;
    case QuantKind::kQ5_K:
      return DecodeTileAs<QuantKind::kQ5_K>(w, t, out), true;
    case QuantKind::kQ6_K:
      return DecodeSignedTileAs<QuantKind::kQ6_K>(w, t, out), true;
    case QuantKind::kIQ4_XS:
      return DecodeSignedTileAs<QuantKind::kIQ4_XS>(w, t, out), true;
    case QuantKind::kQ8_0:
      return false;
  }
  return false;
}

template <int kMr>
void TileAvx512(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                int64_t i0, const uint8_t* decoded, float* y) {
  switch (w.kind) {
    case QuantKind::kQ4_0:
      return NibbleTileAvx512<QuantKind::kQ4_0, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ4_1:
      return NibbleTileAvx512<QuantKind::kQ4_1, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ5_0:
      return NibbleTileAvx512<QuantKind::kQ5_0, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ5_1:
      return NibbleTileAvx512<QuantKind::kQ5_1, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kIQ4_NL:
      return NibbleTileAvx512<QuantKind::kIQ4_NL, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ2_K:
      return SuperTile<QuantKind::kQ2_K, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ3_K:
      return SuperTile<QuantKind::kQ3_K, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ4_K:
      return SuperTile<QuantKind::kQ4_K, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ5_K:
      return SuperTile<QuantKind::kQ5_K, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ6_K:
      return SuperTile<QuantKind::kQ6_K, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kIQ4_XS:
      return SuperTile<QuantKind::kIQ4_XS, kMr>(w, t, a, i0, decoded, y);
    case QuantKind::kQ8_0:
      return Q8TileAvx512<kMr>(w, t, a, i0, y);
  }
}

// Rows [i0, i0 + n) against tile t, n < kMr: the remainder pass.
template <int kMr>
void TileTail(const QuantTiles& w, int64_t t, const QuantizedActs& a,
              int64_t i0, int64_t n, const uint8_t* decoded, float* y) {
  if constexpr (kMr > 1) {
    if (n == kMr - 1) return TileAvx512<kMr - 1>(w, t, a, i0, decoded, y);
    return TileTail<kMr - 1>(w, t, a, i0, n, decoded, y);
  }
}

// All activation rows against tile t, kMaxMr rows per pass. With more than
// one pass, the tile is unpacked once into per-thread scratch (which stays
// in L2) and every pass reads that: the unpacking (planes, code book) is
// then paid once per tile, not once per kMaxMr rows. Plain 4-bit nibbles
// (an AND and a shift per vector) unpack in place up to 4 passes: there the
// scratch's stores and reloads cost more than they save (32 rows: 9-12%).
void TileAllRows(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                 float* y) {
  const uint8_t* decoded = nullptr;
  const NibbleSpec spec = SpecOf(w.kind);
  const bool plain = spec.base == 4 && spec.planes == 0 && !spec.lut;
  if (a.m > kMaxMr && !(plain && a.m <= 4 * kMaxMr)) {
    thread_local AlignedBuffer scratch;
    scratch.EnsureSize(static_cast<size_t>(w.nb * DecodedStride(spec)));
    if (DecodeTile(w, t, scratch.data())) decoded = scratch.data();
  }
  int64_t i0 = 0;
  for (; i0 + kMaxMr <= a.m; i0 += kMaxMr) {
    TileAvx512<kMaxMr>(w, t, a, i0, decoded, y);
  }
  if (i0 < a.m) TileTail<kMaxMr>(w, t, a, i0, a.m - i0, decoded, y);
}

#endif  // KVSERVE_QUANT_VNNI

}  // namespace

const QuantizedActs& ActSet::For(const QuantTiles& w) const {
  const QuantizedActs* a = w.ActGroup() == 256 ? per256 : per32;
  KV_CHECK(a != nullptr && a->group == w.ActGroup(),
           "QuantMatMul: no activations quantized per ", w.ActGroup());
  return *a;
}

bool NeedsActGroup(const QuantTiles& w, int group) {
  if (w.segments.empty()) return w.ActGroup() == group;
  for (const QuantTiles& s : w.segments) {
    if (s.ActGroup() == group) return true;
  }
  return false;
}

bool HaveVnniKernels() {
#ifdef KVSERVE_QUANT_VNNI
  return true;
#else
  return false;
#endif
}

void QuantizeActivations(const float* x, int64_t m, int64_t cols,
                         QuantizedActs* out, bool portable, int group) {
  KV_CHECK((group == 32 || group == 256) && cols % group == 0,
           "QuantizeActivations: group ", group, " for ", cols, " columns");
  const int per = group / static_cast<int>(kQBlock);
  out->group = group;
  out->m = m;
  out->cols = cols;
  out->nb = cols / kQBlock;
  out->q.EnsureSize(static_cast<size_t>(m * cols));
  out->scales.EnsureSize(static_cast<size_t>(m * out->nb) * sizeof(ActScale));
  // Only the K kinds with a zero point read it, all per 256.
  const bool biased = m > kBiasedActsRows && group == 256;
  if (biased) out->biased.EnsureSize(static_cast<size_t>(m * cols));
  int8_t* q = out->q.as<int8_t>();
  ActScale* sc = out->scales.as<ActScale>();
  const auto rows = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      int8_t* qi = q + i * cols;
#ifdef KVSERVE_QUANT_VNNI
      if (!portable) {
        QuantizeRowAvx512(x + i * cols, out->nb, per, qi, sc + i * out->nb);
        if (biased)
          BiasRowAvx512(qi, cols, out->biased.as<uint8_t>() + i * cols);
        continue;
      }
#endif
      QuantizeRowPortable(x + i * cols, out->nb, per, qi, sc + i * out->nb);
      if (biased) {
        uint8_t* ub = out->biased.as<uint8_t>() + i * cols;
        for (int64_t j = 0; j < cols; ++j) {
          ub[j] = static_cast<uint8_t>(qi[j] + 128);
        }
      }
    }
  };
  // NOTE: a row quantizes in ~0.1 us per 1K elements; a parallel region only
  // pays off for big batches.
  if (m * cols >= (int64_t{1} << 16)) {
    ParallelFor(m, 1, rows);
  } else {
    rows(0, m);
  }
  if (group == 256) FillBlockSums(out);
}

void QuantMatMul(const ActSet& acts, const QuantTiles& w, float* y,
                 QuantIsa isa) {
  static const bool avx2 = HaveAvx2Kernels();
  const bool vnni = isa == QuantIsa::kBest && HaveVnniKernels();
  const bool use_avx2 =
      isa == QuantIsa::kAvx2 || (isa == QuantIsa::kBest && !vnni && avx2);
  KV_CHECK(!use_avx2 || avx2, "QuantMatMul: no AVX2 on this CPU");
  // Tile t of the whole matrix: of w, or of the segment that holds it.
  const auto tile = [&](int64_t t) {
    const QuantTiles* seg = &w;
    for (const QuantTiles& s : w.segments) {
      seg = &s;
      if (t < s.num_tiles) break;
      t -= s.num_tiles;
    }
    const QuantizedActs& a = acts.For(*seg);
#ifdef KVSERVE_QUANT_VNNI
    if (vnni) return TileAllRows(*seg, t, a, y);
#endif
    if (use_avx2) return TileAllRowsAvx2(*seg, t, a, y);
    TileAllRowsPortable(*seg, t, a, y);
  };
  ParallelFor(w.num_tiles, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) tile(t);
  });
}

}  // namespace kvserve::models::cpu::internal
