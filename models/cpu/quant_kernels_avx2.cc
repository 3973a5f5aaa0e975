// The AVX2 kernels of the int8 GEMM path, for x86 CPUs without AVX-512
// VNNI: the same QuantTiles (matmul_internal.h) and activations, half a tile
// (8 rows, one int32 lane each) at a time. Compiled into every x86 build
// (for AVX2 + FMA + F16C, whatever the build's target), run where the AVX-512
// VNNI kernels are not compiled in and the CPU has them (HaveAvx2Kernels),
// and by the tests on any x86 machine with AVX2.
//
// Without VPDPBUSD, 4-byte dot products are VPMADDUBSW (u8 x s8 pairs to
// saturating int16) then VPMADDWD against ones. Unsigned nibbles (u <= 63)
// never saturate a pair (63 * 127 * 2 < 2^15); Q8_0 and the IQ4 code book
// are signed bytes up to 128 in magnitude, so they go through the sign trick
// (|w| x sign(a, w)), which stays under 128 * 127 * 2 and needs no zero
// point.
// NOTE: GCC 12 reports false (maybe-)uninitialized warnings inside its
// intrinsic headers (GCC bug 105593); this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "models/cpu/quant_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "models/quant_blocks.h"

#if defined(__clang__)  // which ignores GCC's target pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace kvserve::models::cpu::internal {
namespace {

constexpr int kMaxMr = 4;  // activation rows per pass over a half tile

// The IQ4 code book as signed bytes, twice (one copy per 128-bit lane).
alignas(32) constexpr std::array<int8_t, 32> kIq4Lut = [] {
  std::array<int8_t, 32> t{};
  for (int i = 0; i < 32; ++i) t[i] = kIq4NlValues[i % 16];
  return t;
}();

// One bit plane (the eight 64-bit masks at `m`, matmul_internal.h) added
// to the 8 vectors of half `hf` as `bit` where set: mask 4h + g's bits
// [32 hf, 32 hf + 32) are byte j = bit j of vector 4h + g. Each 128-bit
// lane of a broadcast holds two masks whole, so one VPSHUFB per vector
// spreads its four mask bytes (byte j from byte j / 8), then the bit is
// tested in place.
[[gnu::always_inline]] inline void AddPlane(const uint8_t* m, int hf, char bit,
                                            __m256i* w) {
  const __m256i spread =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                       2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i add = _mm256_set1_epi8(bit);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
    for (int pair = 0; pair < 2; ++pair) {
      const __m256i masks = _mm256_broadcastsi128_si256(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(m + 32 * h + 16 * pair)));
#pragma GCC unroll 2
      for (int k = 0; k < 2; ++k) {
        const __m256i idx = _mm256_add_epi8(
            spread, _mm256_set1_epi8(static_cast<char>(8 * k + 4 * hf)));
        const __m256i v =
            _mm256_and_si256(_mm256_shuffle_epi8(masks, idx), sel);
        __m256i& dst = w[4 * h + 2 * pair + k];
        dst = _mm256_add_epi8(dst,
                              _mm256_and_si256(_mm256_cmpeq_epi8(v, sel), add));
      }
    }
  }
}

// The 32 weights of block `qb` for rows [8 hf, 8 hf + 8) as 8 vectors of
// 4-byte groups: w[g] elements 4g.. (g < 4: first 16; g >= 4: the rest as
// 16 + 4(g - 4)). Unsigned u for the nibble kinds, signed for Q8_0 and the
// code book.
template <QuantKind kKind>
inline void LoadHalf(const uint8_t* qb, int hf, __m256i* w) {
  if constexpr (kKind == QuantKind::kQ8_0) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int g = 0; g < 8; ++g) {
      w[g] = _mm256_xor_si256(
          _mm256_load_si256(
              reinterpret_cast<const __m256i*>(qb + g * 64 + hf * 32)),
          flip);
    }
  } else {
    constexpr NibbleSpec kS = SpecOf(kKind);
    const __m256i field = _mm256_set1_epi8((1 << kS.base) - 1);
    for (int g = 0; g < 4; ++g) {
      if constexpr (kS.base == 4) {
        const __m256i v = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(qb + g * 64 + hf * 32));
        w[g] = _mm256_and_si256(v, field);
        w[4 + g] = _mm256_and_si256(_mm256_srli_epi16(v, 4), field);
      } else {
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_load_si256(
              reinterpret_cast<const __m256i*>(qb + h * 64 + hf * 32));
          w[4 * h + g] = _mm256_and_si256(_mm256_srli_epi16(v, 2 * g), field);
        }
      }
      if constexpr (kS.lut) {
        const __m256i lut =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(kIq4Lut.data()));
        w[g] = _mm256_shuffle_epi8(lut, w[g]);
        w[4 + g] = _mm256_shuffle_epi8(lut, w[4 + g]);
      }
    }
    for (int p = 0; p < kS.planes; ++p) {
      AddPlane(qb + 64 * kS.base + 64 * p, hf,
               static_cast<char>(1 << (kS.base + p)), w);
    }
  }
}

inline __m256i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// Sums of the 4-byte products of w and the activations broadcast from a.
template <bool kSigned>
inline __m256i Dot4(__m256i w, const int8_t* a) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i x = Bcast4(a);
  const __m256i p = kSigned ? _mm256_maddubs_epi16(_mm256_sign_epi8(w, w),
                                                   _mm256_sign_epi8(x, w))
                            : _mm256_maddubs_epi16(w, x);
  return _mm256_madd_epi16(p, ones);
}

inline __m256 Fp16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 Ints8(const void* p, bool is_signed) {
  const __m128i v = _mm_loadl_epi64(static_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(v)
                                      : _mm256_cvtepu8_epi32(v));
}

// Block b's scales for rows [8 hf, 8 hf + 8): dd[h] per scale group (d, or
// for the K kinds d * sub-scale), mm[h] the offsets (m, or dmin * min).
template <QuantKind kKind>
inline void BlockScales(const QuantTiles& w, const uint8_t* tile, int64_t b,
                        int hf, __m256* dd, __m256* mm) {
  constexpr bool kQ8 = kKind == QuantKind::kQ8_0;
  constexpr NibbleSpec kS = kQ8 ? NibbleSpec{} : SpecOf(kKind);
  constexpr int kH = kS.halves;
  if constexpr (kS.super) {
    const SuperLayout L = SuperOf(w, kS, tile);
    const __m256 d = Fp16x8(L.d + b / 8 * kTileRows + 8 * hf);
    for (int h = 0; h < kH; ++h) {
      const int64_t at = (b * kH + h) * kTileRows + 8 * hf;
      if constexpr (kS.sub6) {
        alignas(8) int8_t six[8];
        for (int r = 0; r < 8; ++r) {
          six[r] = static_cast<int8_t>(L.Sub(kS, b, h, 8 * hf + r));
        }
        dd[h] = _mm256_mul_ps(Ints8(six, true), d);
      } else if constexpr (kS.packed) {
        const __m256i v = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(L.subs + at)));
        dd[h] = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))), d);
        mm[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)),
                              Fp16x8(L.dmin + b / 8 * kTileRows + 8 * hf));
      } else {
        dd[h] = _mm256_mul_ps(Ints8(L.subs + at, true), d);
        if constexpr (kS.mins) {
          mm[h] = _mm256_mul_ps(Ints8(L.mins + at, false),
                                Fp16x8(L.dmin + b / 8 * kTileRows + 8 * hf));
        }
      }
    }
  } else {
    // Legacy: fp16 d (and m) per block.
    const auto* ds =
        reinterpret_cast<const uint16_t*>(tile + w.nb * w.QuantBytesPerBlock());
    dd[0] = Fp16x8(ds + b * kTileRows + 8 * hf);
    if constexpr (kS.mins) {
      mm[0] = Fp16x8(ds + w.nb * kTileRows + b * kTileRows + 8 * hf);
    }
  }
}

// Software prefetch of tile t + 1's lines while the first half of tile t
// runs (the second half re-reads lines the first brought in): without it
// the hardware streamer leaves the weights poorly overlapped with the dot
// products, as in the AVX-512 kernels. Small tiles to L1 where the
// load-time measurement chose it (matmul.h), others to L2.
struct NextTile {
  const char* next;
  bool to_l1;

  int64_t qbytes;  // a block's quants
  int64_t share;   // bytes after the quants (scales, mins) per block
  int64_t end;

  NextTile(const QuantTiles& w, const uint8_t* tile, int64_t qbytes)
      : next(reinterpret_cast<const char*>(tile) + w.tile_stride),
        to_l1(w.tile_stride <= kSmallTileBytes &&
              small_tiles_to_l1.load(std::memory_order_relaxed)),
        qbytes(qbytes),
        end(static_cast<int64_t>(w.tile_stride)) {
    share = (end - w.nb * qbytes + w.nb - 1) / w.nb;
  }
  // The lines of the next tile starting in [from, to).
  [[gnu::always_inline]] inline void Lines(int64_t from, int64_t to) const {
    for (int64_t i = (from + 63) & ~int64_t{63}; i < to; i += 64) {
      if (to_l1) {
        _mm_prefetch(next + i, _MM_HINT_T0);
      } else {
        _mm_prefetch(next + i, _MM_HINT_T1);
      }
    }
  }
  // Block b's share of a tile of nb blocks: its quants and 1/nb of what
  // follows them, so that the first half's pass over tile t brings in all
  // of tile t + 1.
  [[gnu::always_inline]] inline void Block(int64_t nb, int64_t b) const {
    Lines(b * qbytes, (b + 1) * qbytes);
    const int64_t from = nb * qbytes + b * share;
    Lines(from, std::min(end, from + share));
  }
};

// Writes rows [8 hf, 8 hf + 8) of tile t (those in the matrix) for
// activation rows [i0, i0 + kMr).
template <int kMr>
void StoreHalf(const QuantTiles& w, int64_t t, int hf, int64_t i0,
               const __m256* acc, float* y) {
  const int64_t first = t * kTileRows + 8 * hf;
  const int64_t valid = std::clamp<int64_t>(w.rows - first, 0, 8);
  for (int r = 0; r < kMr; ++r) {
    alignas(32) float out[8];
    _mm256_store_ps(out, acc[r]);
    float* dst = y + (i0 + r) * w.out_stride + w.out_offset + first;
    std::copy_n(out, valid, dst);
  }
}

// Rows [8 hf, 8 hf + 8) of tile t against activation rows [i0, i0 + kMr).
template <QuantKind kKind, int kMr>
void HalfTile(const QuantTiles& w, int64_t t, int hf, const QuantizedActs& a,
              int64_t i0, float* y) {
  constexpr bool kQ8 = kKind == QuantKind::kQ8_0;
  constexpr NibbleSpec kS = kQ8 ? NibbleSpec{} : SpecOf(kKind);
  constexpr bool kSigned = kQ8 || kS.lut;
  constexpr int kZero = kSigned ? 0 : kS.zero;
  constexpr int kH = kS.halves;
  const int64_t nb = w.nb;
  const int64_t qbytes = w.QuantBytesPerBlock();
  const uint8_t* tile = w.Tile(t);
  __m256 acc[kMr];
  for (int r = 0; r < kMr; ++r) acc[r] = _mm256_setzero_ps();
  const NextTile next(w, tile, qbytes);
  for (int64_t b = 0; b < nb; ++b) {
    if (hf == 0 && i0 == 0) next.Block(w.nb, b);
    __m256i wq[8];
    LoadHalf<kKind>(tile + b * qbytes, hf, wq);
    __m256 dd[2], mm[2];
    BlockScales<kKind>(w, tile, b, hf, dd, mm);
    for (int r = 0; r < kMr; ++r) {
      const int8_t* aq = a.Row(i0 + r) + b * kQBlock;
      const ActScale& sc = a.Scales(i0 + r)[b];
      __m256i s0 = _mm256_set1_epi32(-kZero * sc.sum_lo);
      __m256i s1 = _mm256_set1_epi32(-kZero * sc.sum_hi);
      for (int g = 0; g < 4; ++g) {
        s0 = _mm256_add_epi32(s0, Dot4<kSigned>(wq[g], aq + 4 * g));
        s1 = _mm256_add_epi32(s1, Dot4<kSigned>(wq[4 + g], aq + 16 + 4 * g));
      }
      const __m256 ad = _mm256_set1_ps(sc.d);
      if constexpr (kH == 2) {
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(s0), dd[0]);
        v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), dd[1], v);
        acc[r] = _mm256_fmadd_ps(v, ad, acc[r]);
        if constexpr (kS.mins) {
          acc[r] = _mm256_fnmadd_ps(
              mm[0], _mm256_set1_ps(static_cast<float>(sc.sum_lo) * sc.d),
              acc[r]);
          acc[r] = _mm256_fnmadd_ps(
              mm[1], _mm256_set1_ps(static_cast<float>(sc.sum_hi) * sc.d),
              acc[r]);
        }
      } else {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
        acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(f, dd[0]), ad, acc[r]);
        if constexpr (kS.mins) {
          // Legacy mins add d-scaled offsets; K mins are subtracted.
          const __m256 s = _mm256_set1_ps(sc.s);
          acc[r] = kS.super ? _mm256_fnmadd_ps(mm[0], s, acc[r])
                            : _mm256_fmadd_ps(mm[0], s, acc[r]);
        }
      }
    }
  }
  StoreHalf<kMr>(w, t, hf, i0, acc, y);
}

// Sub-scales of rows [8 hf, 8 hf + 8) (8 int8 at p) as int32 lanes.
inline __m256i Sub32(const int8_t* p) {
  return _mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// Per int32 lane the int16 pair (lo, hi) of two int32 lanes in range.
inline __m256i Pair16(__m256i lo, __m256i hi) {
  return _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(0xffff)),
                         _mm256_slli_epi32(hi, 16));
}

// The K kinds with a byte sub-scale per group (Q4_K, Q5_K, Q6_K, IQ4_XS),
// as llama.cpp's AVX2 Q8_K dot products: VPMADDUBSW pair sums added in
// int16 while they cannot overflow, VPMADDWD against the group's sub-scale
// pair (which is the add of the pairs and the scaling in one), int32 over a
// 256-block; the zero point's and the mins' terms in integers too; one
// conversion per 256. Exact integers, so a row's result does not depend on
// the pass it runs in.
// `decoded`: for kHf 1, half hf0 of the tile as LoadHalf gives it, 8
// vectors per block (DecodeHalf), read by every pass of a large batch.
template <QuantKind kKind, int kMr, int kHf>
void SuperTileAvx2(const QuantTiles& w, int64_t t, int hf0,
                   const QuantizedActs& a, int64_t i0, const __m256i* decoded,
                   float* y) {
  constexpr NibbleSpec kS = SpecOf(kKind);
  static_assert(kS.super && !kS.packed && !kS.sub6);
  static_assert(!kS.mins || kS.halves == 1);
  constexpr bool kSigned = kS.lut;  // the code book, signed
  constexpr int kZero = kSigned ? 0 : kS.zero;
  constexpr int kH = kS.halves;
  // Pair sums (each at most 2 * 127 * the largest |weight|) that add in
  // int16 without saturating.
  constexpr int kMaxW = kSigned ? 128 : (1 << (kS.base + kS.planes)) - 1;
  constexpr int kRun = std::max(1, 32767 / (2 * 127 * kMaxW));
  const int64_t qbytes = kS.QuantBytes();
  const uint8_t* tile = w.Tile(t);
  const SuperLayout L = SuperOf(w, kS, tile);
  const NextTile next(w, tile, qbytes);
  __m256 acc[kHf][kMr];
#pragma GCC unroll 2
  for (int f = 0; f < kHf; ++f) {
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) acc[f][r] = _mm256_setzero_ps();
  }
  for (int64_t b0 = 0; b0 < w.nb; b0 += 8) {
    __m256i isum[kHf][kMr];
#pragma GCC unroll 2
    for (int f = 0; f < kHf; ++f) {
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) isum[f][r] = _mm256_setzero_si256();
    }
    for (int64_t b = b0; b < b0 + 8; ++b) {
      if (hf0 == 0 && i0 == 0) next.Block(w.nb, b);
      __m256i wq[kHf][8];
      __m256i pair[kHf][kH];
      __m256i zero_pair[kHf];
#pragma GCC unroll 2
      for (int f = 0; f < kHf; ++f) {
        const int hf = hf0 + f;
        if (decoded != nullptr) {
#pragma GCC unroll 8
          for (int g = 0; g < 8; ++g)
            wq[f][g] = _mm256_load_si256(decoded + 8 * b + g);
        } else {
          LoadHalf<kKind>(tile + b * qbytes, hf, wq[f]);
        }
        const __m256i s0 = Sub32(L.subs + b * kH * kTileRows + 8 * hf);
        const __m256i s1 =
            kH == 2 ? Sub32(L.subs + (b * kH + 1) * kTileRows + 8 * hf) : s0;
        pair[f][0] = Pair16(s0, s0);
        if constexpr (kH == 2) pair[f][kH - 1] = Pair16(s1, s1);
        zero_pair[f] = _mm256_setzero_si256();
        if constexpr (kZero != 0) {
          const __m256i z = _mm256_set1_epi32(-kZero);
          zero_pair[f] =
              Pair16(_mm256_mullo_epi32(s0, z), _mm256_mullo_epi32(s1, z));
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
        const int8_t* aq = a.Row(i0 + r) + b * kQBlock;
        __m256i run[kHf];
        int n = 0;
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          const __m256i x = Bcast4(aq + (g < 4 ? 4 * g : 16 + 4 * (g - 4)));
#pragma GCC unroll 2
          for (int f = 0; f < kHf; ++f) {
            const __m256i v = wq[f][g];
            const __m256i p = kSigned
                                  ? _mm256_maddubs_epi16(_mm256_sign_epi8(v, v),
                                                         _mm256_sign_epi8(x, v))
                                  : _mm256_maddubs_epi16(v, x);
            run[f] = n == 0 ? p : _mm256_add_epi16(run[f], p);
          }
          ++n;
          const int h = kH == 2 && g >= 4 ? 1 : 0;
          if (n == kRun || g == 7 || (kH == 2 && g == 3)) {
#pragma GCC unroll 2
            for (int f = 0; f < kHf; ++f) {
              isum[f][r] = _mm256_add_epi32(
                  isum[f][r], _mm256_madd_epi16(run[f], pair[f][h]));
            }
            n = 0;
          }
        }
        if constexpr (kZero != 0) {
          const __m256i sums = Bcast4(
              reinterpret_cast<const int8_t*>(&a.Scales(i0 + r)[b].sum_lo));
#pragma GCC unroll 2
          for (int f = 0; f < kHf; ++f) {
            isum[f][r] = _mm256_add_epi32(
                isum[f][r], _mm256_madd_epi16(zero_pair[f], sums));
          }
        }
      }
    }
#pragma GCC unroll 2
    for (int f = 0; f < kHf; ++f) {
      const __m256 d = Fp16x8(L.d + b0 / 8 * kTileRows + 8 * (hf0 + f));
#pragma GCC unroll 8
      for (int r = 0; r < kMr; ++r) {
        const __m256 ad = _mm256_set1_ps(a.Scales(i0 + r)[b0].d);
        acc[f][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[f][r]),
                                    _mm256_mul_ps(d, ad), acc[f][r]);
      }
    }
    if constexpr (kS.mins) {
      // sum_b min_b sum(q_b), two blocks per VPMADDWD: lane r holds the
      // pair (min_b, min_b+1) of its row.
#pragma GCC unroll 2
      for (int f = 0; f < kHf; ++f) {
        const int hf = hf0 + f;
        __m256i imin[kMr];
#pragma GCC unroll 8
        for (int r = 0; r < kMr; ++r) imin[r] = _mm256_setzero_si256();
        for (int64_t b = b0; b < b0 + 8; b += 2) {
          const __m128i m0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
              L.mins + b * kTileRows + 8 * hf));
          const __m128i m1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
              L.mins + (b + 1) * kTileRows + 8 * hf));
          const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m0, m1));
#pragma GCC unroll 8
          for (int r = 0; r < kMr; ++r) {
            const __m256i sums = Bcast4(
                reinterpret_cast<const int8_t*>(a.BlockSums(i0 + r) + b));
            imin[r] = _mm256_add_epi32(imin[r], _mm256_madd_epi16(mins, sums));
          }
        }
        const __m256 dmin = Fp16x8(L.dmin + b0 / 8 * kTileRows + 8 * hf);
#pragma GCC unroll 8
        for (int r = 0; r < kMr; ++r) {
          const __m256 ad = _mm256_set1_ps(a.Scales(i0 + r)[b0].d);
          acc[f][r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin[r]),
                                       _mm256_mul_ps(dmin, ad), acc[f][r]);
        }
      }
    }
  }
#pragma GCC unroll 2
  for (int f = 0; f < kHf; ++f) StoreHalf<kMr>(w, t, hf0 + f, i0, acc[f], y);
}

template <QuantKind kKind>
void AllRows(const QuantTiles& w, int64_t t, const QuantizedActs& a, float* y) {
  constexpr bool kSuper =
      kKind == QuantKind::kQ4_K || kKind == QuantKind::kQ5_K ||
      kKind == QuantKind::kQ6_K || kKind == QuantKind::kIQ4_XS;
  if constexpr (kSuper) {
    // A single row runs both halves in one pass (one broadcast of each
    // activation word for 16 weight rows); both give the same bits.
    if (a.m == 1 && t * kTileRows + 8 < w.rows) {
      return SuperTileAvx2<kKind, 1, 2>(w, t, 0, a, 0, nullptr, y);
    }
  }
  for (int hf = 0; hf < 2; ++hf) {
    if (t * kTileRows + 8 * hf >= w.rows) break;
    // More than one pass: the half tile unpacked once (per-thread scratch,
    // 256 bytes a block, in L2) for all of them, as the AVX-512 kernels do.
    const __m256i* decoded = nullptr;
    if constexpr (kSuper) {
      if (a.m > kMaxMr) {
        thread_local AlignedBuffer scratch;
        scratch.EnsureSize(static_cast<size_t>(w.nb) * 8 * sizeof(__m256i));
        auto* out = reinterpret_cast<__m256i*>(scratch.data());
        const int64_t qbytes = SpecOf(kKind).QuantBytes();
        for (int64_t b = 0; b < w.nb; ++b) {
          LoadHalf<kKind>(w.Tile(t) + b * qbytes, hf, out + 8 * b);
        }
        decoded = out;
      }
    }
    int64_t i0 = 0;
    for (; i0 + kMaxMr <= a.m; i0 += kMaxMr) {
      if constexpr (kSuper) {
        SuperTileAvx2<kKind, kMaxMr, 1>(w, t, hf, a, i0, decoded, y);
      } else {
        HalfTile<kKind, kMaxMr>(w, t, hf, a, i0, y);
      }
    }
    for (; i0 < a.m; ++i0) {
      if constexpr (kSuper) {
        SuperTileAvx2<kKind, 1, 1>(w, t, hf, a, i0, decoded, y);
      } else {
        HalfTile<kKind, 1>(w, t, hf, a, i0, y);
      }
    }
  }
}

}  // namespace

bool HaveAvx2Kernels() {
  // F16C: CPUID leaf 1, ECX bit 29 (not every compiler's
  // __builtin_cpu_supports knows it; "avx2" covers the OS's AVX state).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx >> 29 & 1);
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         f16c;
}

void TileAllRowsAvx2(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                     float* y) {
  switch (w.kind) {
    case QuantKind::kQ4_0:
      return AllRows<QuantKind::kQ4_0>(w, t, a, y);
    case QuantKind::kQ4_1:
      return AllRows<QuantKind::kQ4_1>(w, t, a, y);
    case QuantKind::kQ5_0:
      return AllRows<QuantKind::kQ5_0>(w, t, a, y);
    case QuantKind::kQ5_1:
      return AllRows<QuantKind::kQ5_1>(w, t, a, y);
    case QuantKind::kIQ4_NL:
      return AllRows<QuantKind::kIQ4_NL>(w, t, a, y);
    case QuantKind::kQ8_0:
      return AllRows<QuantKind::kQ8_0>(w, t, a, y);
    case QuantKind::kQ2_K:
      return AllRows<QuantKind::kQ2_K>(w, t, a, y);
    case QuantKind::kQ3_K:
      return AllRows<QuantKind::kQ3_K>(w, t, a, y);
    case QuantKind::kQ4_K:
      return AllRows<QuantKind::kQ4_K>(w, t, a, y);
    case QuantKind::kQ5_K:
      return AllRows<QuantKind::kQ5_K>(w, t, a, y);
    case QuantKind::kQ6_K:
      return AllRows<QuantKind::kQ6_K>(w, t, a, y);
    case QuantKind::kIQ4_XS:
      return AllRows<QuantKind::kIQ4_XS>(w, t, a, y);
  }
}

}  // namespace kvserve::models::cpu::internal

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#else  // not x86

namespace kvserve::models::cpu::internal {
bool HaveAvx2Kernels() { return false; }
void TileAllRowsAvx2(const QuantTiles&, int64_t, const QuantizedActs&, float*) {
}
}  // namespace kvserve::models::cpu::internal

#endif
