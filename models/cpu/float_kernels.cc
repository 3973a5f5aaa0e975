// NOTE: GCC 12 reports false (maybe-)uninitialized warnings inside its AVX-512
// intrinsic headers (GCC bug 105593); this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "models/cpu/float_kernels.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "models/dequant.h"

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define KVSERVE_FLOAT_AVX512 1
#include <immintrin.h>
#elif defined(__x86_64__)
#include <immintrin.h>

#include "models/cpu/quant_kernels.h"  // HaveAvx2Kernels
#endif

namespace kvserve::models::cpu::internal {
namespace {

size_t ElementBytes(GgmlType type) { return type == GgmlType::kF32 ? 4 : 2; }

float LoadScalar(GgmlType type, const uint8_t* row, int64_t k) {
  switch (type) {
    case GgmlType::kF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return Fp16ToFp32(h);
    }
    case GgmlType::kBF16: {
      uint16_t h;
      std::memcpy(&h, row + 2 * k, 2);
      return Bf16ToFp32(h);
    }
    default: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
  }
}

void FloatRowsScalar(const float* x, int64_t m, const FloatRows& w, int64_t lo,
                     int64_t hi, float* y) {
  const size_t row_bytes = w.cols * ElementBytes(w.type);
  for (int64_t r = lo; r < hi; ++r) {
    const uint8_t* row = w.buf.data() + r * row_bytes;
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) {
        acc += x[i * w.cols + k] * LoadScalar(w.type, row, k);
      }
      y[i * w.rows + r] = acc;
    }
  }
}

#ifdef KVSERVE_FLOAT_AVX512
// 16 weights at `p` (masked), widened to fp32.
template <GgmlType kType>
inline __m512 LoadW(const void* p, __mmask16 mask) {
  if constexpr (kType == GgmlType::kF32) {
    return _mm512_maskz_loadu_ps(mask, p);
  } else if constexpr (kType == GgmlType::kF16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p));
  } else {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
}

// kNr weight rows (from r0) x kMr activation rows (from i0): kMr * kNr
// vector accumulators over k, reduced horizontally at the end.
template <GgmlType kType, int kMr, int kNr>
void FloatBlockAvx512(const float* x, const FloatRows& w, int64_t i0,
                      int64_t r0, float* y) {
  constexpr size_t kEb = kType == GgmlType::kF32 ? 4 : 2;
  const int64_t cols = w.cols;
  const uint8_t* wr = w.buf.data() + r0 * cols * kEb;
  __m512 acc[kMr][kNr];
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < cols; k += 16) {
    const int64_t left = cols - k;
    const __mmask16 mask = left >= 16
                               ? __mmask16{0xffff}
                               : static_cast<__mmask16>((1u << left) - 1);
    __m512 wv[kNr];
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) {
      const uint8_t* p = wr + (j * cols + k) * kEb;
      // NOTE: the next kNr-row block, same columns (see quant_kernels.cc).
      _mm_prefetch(reinterpret_cast<const char*>(p) + kNr * cols * kEb,
                   _MM_HINT_T0);
      wv[j] = LoadW<kType>(p, mask);
    }
#pragma GCC unroll 8
    for (int i = 0; i < kMr; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + (i0 + i) * cols + k);
#pragma GCC unroll 8
      for (int j = 0; j < kNr; ++j) {
        acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kNr; ++j) {
      y[(i0 + i) * w.rows + r0 + j] = _mm512_reduce_add_ps(acc[i][j]);
    }
  }
}

template <GgmlType kType, int kMr>
void FloatRowsMr(const float* x, const FloatRows& w, int64_t i0, int64_t lo,
                 int64_t hi, float* y) {
  int64_t r = lo;
  for (; r + 4 <= hi; r += 4) FloatBlockAvx512<kType, kMr, 4>(x, w, i0, r, y);
  for (; r < hi; ++r) FloatBlockAvx512<kType, kMr, 1>(x, w, i0, r, y);
}

// Rows [lo, hi) for all activation rows; activation groups of 4 innermost
// so a 4-row weight block is reused from L1.
template <GgmlType kType>
void FloatRowsAvx512(const float* x, int64_t m, const FloatRows& w, int64_t lo,
                     int64_t hi, float* y) {
  for (int64_t r = lo; r < hi; r += 4) {
    const int64_t r_hi = std::min(hi, r + 4);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) FloatRowsMr<kType, 4>(x, w, i, r, r_hi, y);
    switch (m - i) {
      case 1:
        FloatRowsMr<kType, 1>(x, w, i, r, r_hi, y);
        break;
      case 2:
        FloatRowsMr<kType, 2>(x, w, i, r, r_hi, y);
        break;
      case 3:
        FloatRowsMr<kType, 3>(x, w, i, r, r_hi, y);
        break;
      default:
        break;
    }
  }
}
#endif  // KVSERVE_FLOAT_AVX512

#if defined(__x86_64__) && !defined(KVSERVE_FLOAT_AVX512)
// The same blocking in AVX2 + FMA + F16C, for x86 CPUs without AVX-512
// (compiled for them whatever the build's target; run where
// HaveAvx2Kernels()): 8 columns per step, the columns past the last
// multiple of 8 in scalar code added after the horizontal sum, so a row's
// result does not depend on the activation rows it is blocked with.
#if defined(__clang__)  // which ignores GCC's target pragma
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
template <GgmlType kType>
inline __m256 LoadW8(const uint8_t* p) {
  if constexpr (kType == GgmlType::kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (kType == GgmlType::kF16) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i v = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
}

inline float Sum8(__m256 v) {
  const __m128 s =
      _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

template <GgmlType kType, int kMr, int kNr>
void FloatBlockAvx2(const float* x, const FloatRows& w, int64_t i0, int64_t r0,
                    float* y) {
  constexpr size_t kEb = kType == GgmlType::kF32 ? 4 : 2;
  const int64_t cols = w.cols;
  const int64_t vec = cols & ~int64_t{7};
  const uint8_t* wr = w.buf.data() + r0 * cols * kEb;
  __m256 acc[kMr][kNr];
  for (int i = 0; i < kMr; ++i) {
    for (int j = 0; j < kNr; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < vec; k += 8) {
    __m256 wv[kNr];
    for (int j = 0; j < kNr; ++j) {
      const uint8_t* p = wr + (j * cols + k) * kEb;
      // The next kNr-row block, same columns, a line per 64 bytes.
      if ((k * kEb) % 64 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(p) + kNr * cols * kEb,
                     _MM_HINT_T0);
      }
      wv[j] = LoadW8<kType>(p);
    }
    for (int i = 0; i < kMr; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + (i0 + i) * cols + k);
      for (int j = 0; j < kNr; ++j) {
        acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < kMr; ++i) {
    for (int j = 0; j < kNr; ++j) {
      float sum = Sum8(acc[i][j]);
      const uint8_t* row = wr + j * cols * kEb;
      for (int64_t k = vec; k < cols; ++k) {
        sum += x[(i0 + i) * cols + k] * LoadScalar(w.type, row, k);
      }
      y[(i0 + i) * w.rows + r0 + j] = sum;
    }
  }
}

template <GgmlType kType>
void FloatRowsAvx2(const float* x, int64_t m, const FloatRows& w, int64_t lo,
                   int64_t hi, float* y) {
  // 3 x 4 accumulators + 4 weight vectors + one activation: 17 of 16
  // registers at kMr 3; 2 rows per pass keeps them all in registers.
  for (int64_t r = lo; r < hi; r += 4) {
    const int64_t r_hi = std::min(hi, r + 4);
    int64_t i = 0;
    for (; i + 2 <= m; i += 2) {
      int64_t j = r;
      for (; j + 4 <= r_hi; j += 4) FloatBlockAvx2<kType, 2, 4>(x, w, i, j, y);
      for (; j < r_hi; ++j) FloatBlockAvx2<kType, 2, 1>(x, w, i, j, y);
    }
    if (i < m) {
      int64_t j = r;
      for (; j + 4 <= r_hi; j += 4) FloatBlockAvx2<kType, 1, 4>(x, w, i, j, y);
      for (; j < r_hi; ++j) FloatBlockAvx2<kType, 1, 1>(x, w, i, j, y);
    }
  }
}
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#define KVSERVE_FLOAT_AVX2 1
#endif

}  // namespace

absl::StatusOr<FloatRows> PackFloatRows(GgmlType type, const void* src,
                                        int64_t rows, int64_t cols) {
  if (type != GgmlType::kF32 && type != GgmlType::kF16 &&
      type != GgmlType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PackFloatRows: not a float type: ", std::string(TypeName(type))));
  }
  FloatRows w;
  w.type = type;
  w.rows = rows;
  w.cols = cols;
  const size_t bytes = static_cast<size_t>(rows * cols) * ElementBytes(type);
  w.buf.Resize(bytes);
  std::memcpy(w.buf.data(), src, bytes);
  return w;
}

FloatRows FloatRowsFromF32(const float* src, int64_t rows, int64_t cols) {
  FloatRows w;
  w.rows = rows;
  w.cols = cols;
  w.buf.Resize(static_cast<size_t>(rows * cols) * sizeof(float));
  std::memcpy(w.buf.data(), src, w.buf.size());
  return w;
}

void FloatMatMul(const float* x, int64_t m, const FloatRows& w, float* y,
                 bool portable) {
  ParallelFor(w.rows, 4, [&](int64_t lo, int64_t hi) {
#ifdef KVSERVE_FLOAT_AVX512
    if (!portable) {
      switch (w.type) {
        case GgmlType::kF16:
          return FloatRowsAvx512<GgmlType::kF16>(x, m, w, lo, hi, y);
        case GgmlType::kBF16:
          return FloatRowsAvx512<GgmlType::kBF16>(x, m, w, lo, hi, y);
        default:
          return FloatRowsAvx512<GgmlType::kF32>(x, m, w, lo, hi, y);
      }
    }
#endif
#ifdef KVSERVE_FLOAT_AVX2
    static const bool avx2 = HaveAvx2Kernels();
    if (!portable && avx2) {
      switch (w.type) {
        case GgmlType::kF16:
          return FloatRowsAvx2<GgmlType::kF16>(x, m, w, lo, hi, y);
        case GgmlType::kBF16:
          return FloatRowsAvx2<GgmlType::kBF16>(x, m, w, lo, hi, y);
        default:
          return FloatRowsAvx2<GgmlType::kF32>(x, m, w, lo, hi, y);
      }
    }
#endif
    FloatRowsScalar(x, m, w, lo, hi, y);
  });
}

absl::Status DequantizeRows(GgmlType type, const void* src, int64_t rows,
                            int64_t cols, float* dst) {
  const GgmlTypeTraits tr = TypeTraits(type);
  if (!tr.supported || cols % tr.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DequantizeRows: unsupported ",
                     std::string(TypeName(type)), " x ", cols));
  }
  const size_t row_bytes = RowBytes(type, cols);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  ParallelFor(rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      // The type and shape were checked above: it cannot fail.
      (void)models::DequantizeRow(type, s + r * row_bytes, dst + r * cols,
                                  cols);
    }
  });
  return absl::OkStatus();
}

}  // namespace kvserve::models::cpu::internal
