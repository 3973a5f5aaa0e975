// NOTE: GCC 12 reports false (maybe-)uninitialized warnings inside its AVX-512
// intrinsic headers (GCC bug 105593); this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "models/cpu/quant_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define KVSERVE_QUANT_VNNI 1
#include <immintrin.h>
#endif

namespace kvserve::models::cpu::internal {
namespace {

// Activation rows sharing one pass over a weight tile.
constexpr int kMaxMr = 8;

void QuantizeRowScalar(const float* x, int64_t nb, int8_t* q, ActScale* sc) {
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQBlock;
    float amax = 0.0f;
    for (int j = 0; j < kQBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sums[2] = {0, 0};
    for (int j = 0; j < kQBlock; ++j) {
      const int v = static_cast<int>(std::nearbyint(xb[j] * id));
      q[b * kQBlock + j] = static_cast<int8_t>(v);
      sums[j / 16] += v;
    }
    sc[b] = {d, d * static_cast<float>(sums[0] + sums[1]), sums[0], sums[1]};
  }
}

// Weight k of tile row r in block b, as the signed/offset integer the VNNI
// kernel would feed (Q4: 0..15; Q8: q + 128).
int WeightQuant(const QuantTiles& w, const uint8_t* qb, int r, int k) {
  if (w.kind == QuantKind::kQ8_0 || w.kind == QuantKind::kI8S16) {
    return qb[(k / 4) * 64 + r * 4 + k % 4];
  }
  const int j = k % 16;
  const uint8_t byte = qb[(j / 4) * 64 + r * 4 + j % 4];
  return k < 16 ? (byte & 0x0f) : (byte >> 4);
}

// I8S16: per 16-element half h, s_h * (dot - 128 sum(a)) + o_h * sum(a),
// the int32 parts exact.
void I8S16TileScalar(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                     float* y) {
  const uint8_t* tile = w.Tile(t);
  const auto* scales = reinterpret_cast<const float*>(tile + w.nb * 512);
  const int64_t valid = std::min<int64_t>(kTileRows, w.rows - t * kTileRows);
  const int64_t per_block = w.has_offsets ? 64 : 32;  // floats
  for (int64_t i = 0; i < a.m; ++i) {
    for (int r = 0; r < valid; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < w.nb; ++b) {
        const uint8_t* qb = tile + b * 512;
        const int8_t* aq = a.Row(i) + b * kQBlock;
        const ActScale& sc = a.Scales(i)[b];
        const float* s = scales + b * per_block;
        for (int h = 0; h < 2; ++h) {
          const int32_t sum = h == 0 ? sc.sum_lo : sc.sum_hi;
          int32_t dot = 0;
          for (int k = 16 * h; k < 16 * h + 16; ++k) {
            dot += WeightQuant(w, qb, r, k) * aq[k];
          }
          const float f = static_cast<float>(dot - 128 * sum);
          acc += s[16 * h + r] * (f * sc.d);
          if (w.has_offsets) {
            acc += s[32 + 16 * h + r] * (static_cast<float>(sum) * sc.d);
          }
        }
      }
      y[i * w.rows + t * kTileRows + r] = acc;
    }
  }
}

void TileAllRowsScalar(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                       float* y) {
  if (w.kind == QuantKind::kI8S16) return I8S16TileScalar(w, t, a, y);
  const int64_t nb = w.nb;
  const int64_t qbytes = w.QuantBytesPerBlock();
  const uint8_t* tile = w.Tile(t);
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(tile + nb * qbytes);
  const uint16_t* ms = ds + nb * kTileRows;
  const float offset = w.kind == QuantKind::kQ8_0   ? 128.0f
                       : w.kind == QuantKind::kQ4_0 ? 8.0f
                                                    : 0.0f;
  const int64_t valid = std::min<int64_t>(kTileRows, w.rows - t * kTileRows);
  for (int64_t i = 0; i < a.m; ++i) {
    for (int r = 0; r < valid; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* qb = tile + b * qbytes;
        const int8_t* aq = a.Row(i) + b * kQBlock;
        const ActScale& sc = a.Scales(i)[b];
        int dot = 0;
        for (int k = 0; k < kQBlock; ++k)
          dot += WeightQuant(w, qb, r, k) * aq[k];
        const float dw = Fp16ToFp32(ds[b * kTileRows + r]);
        acc += dw * (static_cast<float>(dot) * sc.d - offset * sc.s);
        if (w.kind == QuantKind::kQ4_1) {
          acc += Fp16ToFp32(ms[b * kTileRows + r]) * sc.s;
        }
      }
      y[i * w.rows + t * kTileRows + r] = acc;
    }
  }
}

#ifdef KVSERVE_QUANT_VNNI
void QuantizeRowAvx512(const float* x, int64_t nb, int8_t* q, ActScale* sc) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 x0 = _mm512_loadu_ps(x + b * kQBlock);
    const __m512 x1 = _mm512_loadu_ps(x + b * kQBlock + 16);
    const __m512 ax =
        _mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1));
    const float amax = _mm512_reduce_max_ps(ax);
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQBlock),
                     _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + b * kQBlock + 16),
                     _mm512_cvtsepi32_epi8(q1));
    const int lo = _mm512_reduce_add_epi32(q0);
    const int hi = _mm512_reduce_add_epi32(q1);
    sc[b] = {d, d * static_cast<float>(lo + hi), lo, hi};
  }
}

inline __m512i Bcast4(const int8_t* p) {
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
        to_l1(w.tile_stride <= 16 * 1024) {}
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
    _mm512_mask_storeu_ps(y + (i0 + r) * w.rows + t * kTileRows, mask, acc[r]);
  }
}

// One 16-row tile x kMr activation rows for Q4_0 / Q4_1: per block, unpack
// the nibbles once and run 8 VPDPBUSD per activation row; the int32 block
// sums are scaled into fp32 accumulators (one lane per weight row).
template <QuantKind kKind, int kMr>
void Q4TileAvx512(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                  int64_t i0, float* y) {
  const int64_t nb = w.nb;
  const uint8_t* tile = w.Tile(t);
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(tile + nb * 256);
  const uint16_t* ms = ds + nb * kTileRows;
  const __m512i low = _mm512_set1_epi8(0x0f);
  const TilePrefetch prefetch(w);
  __m512 acc[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qb = tile + b * 256;
    prefetch.Lines4(qb);
    prefetch.Line(ds + b * kTileRows);
    if constexpr (kKind == QuantKind::kQ4_1) prefetch.Line(ms + b * kTileRows);
    __m512i lo[4], hi[4];
#pragma GCC unroll 8
    for (int g = 0; g < 4; ++g) {
      const __m512i v = _mm512_load_si512(qb + g * 64);
      lo[g] = _mm512_and_si512(v, low);
      hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
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
      if constexpr (kKind == QuantKind::kQ4_0) {
        // sum (q - 8) a = dot - 8 sum(a).
        const __m512 v = _mm512_fmadd_ps(f, _mm512_set1_ps(sc.d),
                                         _mm512_set1_ps(-8.0f * sc.s));
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

// I8S16: quants as Q8_0, but a scale (and offset) per 16-element half, so
// each half keeps its own int32 sum; dot - 128 sum(a) is exact in int32.
template <bool kOffsets, int kMr>
void I8S16TileAvx512(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                     int64_t i0, float* y) {
  const int64_t nb = w.nb;
  const uint8_t* tile = w.Tile(t);
  const auto* scales = reinterpret_cast<const float*>(tile + nb * 512);
  constexpr int64_t kPerBlock = kOffsets ? 64 : 32;  // floats
  const TilePrefetch prefetch(w);
  __m512 acc[kMr];
#pragma GCC unroll 8
  for (int r = 0; r < kMr; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* qb = tile + b * 512;
    const float* sb = scales + b * kPerBlock;
    prefetch.Lines4(qb);
    prefetch.Lines4(qb + 256);
    prefetch.Line(sb);
    prefetch.Line(sb + 16);
    __m512i wq[8];
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) wq[g] = _mm512_load_si512(qb + g * 64);
    const __m512 s0 = _mm512_load_ps(sb);
    const __m512 s1 = _mm512_load_ps(sb + 16);
    __m512 o0 = _mm512_setzero_ps();
    __m512 o1 = _mm512_setzero_ps();
    if constexpr (kOffsets) {
      o0 = _mm512_load_ps(sb + 32);
      o1 = _mm512_load_ps(sb + 48);
    }
#pragma GCC unroll 8
    for (int r = 0; r < kMr; ++r) {
      const int8_t* aq = a.Row(i0 + r) + b * kQBlock;
      const ActScale& sc = a.Scales(i0 + r)[b];
      __m512i lo = _mm512_set1_epi32(-128 * sc.sum_lo);
      __m512i hi = _mm512_set1_epi32(-128 * sc.sum_hi);
#pragma GCC unroll 8
      for (int g = 0; g < 4; ++g) {
        lo = _mm512_dpbusd_epi32(lo, wq[g], Bcast4(aq + 4 * g));
        hi = _mm512_dpbusd_epi32(hi, wq[g + 4], Bcast4(aq + 16 + 4 * g));
      }
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), s0);
      v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), s1, v);
      acc[r] = _mm512_fmadd_ps(v, _mm512_set1_ps(sc.d), acc[r]);
      if constexpr (kOffsets) {
        acc[r] = _mm512_fmadd_ps(
            o0, _mm512_set1_ps(static_cast<float>(sc.sum_lo) * sc.d), acc[r]);
        acc[r] = _mm512_fmadd_ps(
            o1, _mm512_set1_ps(static_cast<float>(sc.sum_hi) * sc.d), acc[r]);
      }
    }
  }
  StoreTileRows<kMr>(w, t, i0, acc, y);
}

template <int kMr>
void TileAvx512(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                int64_t i0, float* y) {
  switch (w.kind) {
    case QuantKind::kI8S16:
      if (w.has_offsets) return I8S16TileAvx512<true, kMr>(w, t, a, i0, y);
      return I8S16TileAvx512<false, kMr>(w, t, a, i0, y);
    case QuantKind::kQ4_0:
      return Q4TileAvx512<QuantKind::kQ4_0, kMr>(w, t, a, i0, y);
    case QuantKind::kQ4_1:
      return Q4TileAvx512<QuantKind::kQ4_1, kMr>(w, t, a, i0, y);
    case QuantKind::kQ8_0:
      return Q8TileAvx512<kMr>(w, t, a, i0, y);
  }
}

// Rows [i0, i0 + n) against tile t, n < kMr: the remainder pass.
template <int kMr>
void TileTail(const QuantTiles& w, int64_t t, const QuantizedActs& a,
              int64_t i0, int64_t n, float* y) {
  if constexpr (kMr > 1) {
    if (n == kMr - 1) return TileAvx512<kMr - 1>(w, t, a, i0, y);
    return TileTail<kMr - 1>(w, t, a, i0, n, y);
  }
}

// All activation rows against tile t, kMaxMr rows per pass.
void TileAllRows(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                 float* y) {
  int64_t i0 = 0;
  for (; i0 + kMaxMr <= a.m; i0 += kMaxMr) TileAvx512<kMaxMr>(w, t, a, i0, y);
  if (i0 < a.m) TileTail<kMaxMr>(w, t, a, i0, a.m - i0, y);
}

#endif  // KVSERVE_QUANT_VNNI

}  // namespace

bool HaveVnniKernels() {
#ifdef KVSERVE_QUANT_VNNI
  return true;
#else
  return false;
#endif
}

void QuantizeActivations(const float* x, int64_t m, int64_t cols,
                         QuantizedActs* out, bool portable) {
  out->m = m;
  out->cols = cols;
  out->nb = cols / kQBlock;
  out->q.EnsureSize(static_cast<size_t>(m * cols));
  out->scales.EnsureSize(static_cast<size_t>(m * out->nb) * sizeof(ActScale));
  int8_t* q = out->q.as<int8_t>();
  ActScale* sc = out->scales.as<ActScale>();
  const auto rows = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
#ifdef KVSERVE_QUANT_VNNI
      if (!portable) {
        QuantizeRowAvx512(x + i * cols, out->nb, q + i * cols,
                          sc + i * out->nb);
        continue;
      }
#endif
      QuantizeRowScalar(x + i * cols, out->nb, q + i * cols, sc + i * out->nb);
    }
  };
  // NOTE: a row quantizes in ~0.1 us per 1K elements; a parallel region only
  // pays off for big batches.
  if (m * cols >= (int64_t{1} << 16)) {
    ParallelFor(m, 1, rows);
  } else {
    rows(0, m);
  }
}

void QuantMatMul(const QuantizedActs& a, const QuantTiles& w, float* y,
                 bool portable) {
  ParallelFor(w.num_tiles, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
#ifdef KVSERVE_QUANT_VNNI
      if (!portable) {
        TileAllRows(w, t, a, y);
        continue;
      }
#endif
      TileAllRowsScalar(w, t, a, y);
    }
  });
}

}  // namespace kvserve::models::cpu::internal
