// NOTE: GCC 12 reports false (maybe-)uninitialized warnings inside its
// AVX-512 intrinsic headers (GCC bug 105593); this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "models/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__AVX512F__)
#define KVSERVE_OPS_AVX512 1
#include <immintrin.h>
#endif

namespace kvserve::models::cpu {
namespace {

#ifdef KVSERVE_OPS_AVX512
inline __mmask16 TailMask(int64_t left) {
  return left >= 16 ? __mmask16{0xffff}
                    : static_cast<__mmask16>((1u << left) - 1);
}

// exp(x) to ~1 ulp-ish (relative error < 2e-7): x = n ln2 + r, |r| <= ln2/2,
// degree-7 Taylor polynomial for e^r, scaled by 2^n. Results below the
// normal range flush to 0 (so exp(-inf) == 0); NaN propagates.
inline __m512 Exp(__m512 x) {
  const __m512 clamped = _mm512_min_ps(x, _mm512_set1_ps(88.8f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), clamped);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512 e = _mm512_scalef_ps(p, n);
  const __mmask16 keep =
      _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);
  return _mm512_maskz_mov_ps(keep, e);
}
#endif  // KVSERVE_OPS_AVX512

}  // namespace

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  int64_t i = 0;
  float ss = 0.0f;
#ifdef KVSERVE_OPS_AVX512
  __m512 acc = _mm512_setzero_ps();
  for (; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(TailMask(n - i), x + i);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  ss = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  i = 0;
#ifdef KVSERVE_OPS_AVX512
  const __m512 s = _mm512_set1_ps(scale);
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), s);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + i)));
  }
#endif
  for (; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
#ifdef KVSERVE_OPS_AVX512
  const __m512 one = _mm512_set1_ps(1.0f);
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 sig = _mm512_div_ps(
        one, _mm512_add_ps(one, Exp(_mm512_sub_ps(_mm512_setzero_ps(), g))));
    _mm512_mask_storeu_ps(
        out + i, m,
        _mm512_mul_ps(_mm512_mul_ps(g, sig), _mm512_maskz_loadu_ps(m, up + i)));
  }
#endif
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

float Dot(const float* a, const float* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#ifdef KVSERVE_OPS_AVX512
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  for (; i + 32 <= n; i += 32) {
    acc0 =
        _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16),
                           _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i),
                           _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
#ifdef KVSERVE_OPS_AVX512
  const __m512 av = _mm512_set1_ps(a);
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i),
                                          _mm512_maskz_loadu_ps(m, y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

void Softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float max = -std::numeric_limits<float>::infinity();
  int64_t i = 0;
#ifdef KVSERVE_OPS_AVX512
  __m512 vmax = _mm512_set1_ps(max);
  for (; i < n; i += 16) {
    vmax = _mm512_mask_max_ps(vmax, TailMask(n - i), vmax,
                              _mm512_maskz_loadu_ps(TailMask(n - i), x + i));
  }
  max = _mm512_reduce_max_ps(vmax);
#endif
  for (; i < n; ++i) max = std::max(max, x[i]);
  float sum = 0.0f;
  i = 0;
#ifdef KVSERVE_OPS_AVX512
  const __m512 mv = _mm512_set1_ps(max);
  __m512 vsum = _mm512_setzero_ps();
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv));
    _mm512_mask_storeu_ps(x + i, m, e);
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e);
  }
  sum = _mm512_reduce_add_ps(vsum);
#endif
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  i = 0;
#ifdef KVSERVE_OPS_AVX512
  const __m512 iv = _mm512_set1_ps(inv);
  for (; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), iv));
  }
#endif
  for (; i < n; ++i) x[i] *= inv;
}

#ifdef KVSERVE_OPS_AVX512
namespace {

// One butterfly pass at distance h < 16 inside a 16-lane vector: lane i
// pairs with lane i ^ h; lanes with bit h clear take the sum, the others
// the difference (partner - self).
template <int kH>
inline __m512 ButterflyInLanes(__m512 v) {
  __m512 p;
  __mmask16 upper;
  if constexpr (kH == 1) {
    p = _mm512_permute_ps(v, 0xB1);
    upper = 0xAAAA;
  } else if constexpr (kH == 2) {
    p = _mm512_permute_ps(v, 0x4E);
    upper = 0xCCCC;
  } else if constexpr (kH == 4) {
    p = _mm512_shuffle_f32x4(v, v, 0xB1);
    upper = 0xF0F0;
  } else {
    p = _mm512_shuffle_f32x4(v, v, 0x4E);
    upper = 0xFF00;
  }
  return _mm512_mask_sub_ps(_mm512_add_ps(v, p), upper, p, v);
}

// HadamardRotate for one chunk of n (a multiple of 16) elements.
void HadamardChunkAvx512(float* c, int n, float scale) {
  for (int i = 0; i < n; i += 16) {
    __m512 v = _mm512_loadu_ps(c + i);
    v = ButterflyInLanes<1>(v);
    v = ButterflyInLanes<2>(v);
    v = ButterflyInLanes<4>(v);
    v = ButterflyInLanes<8>(v);
    _mm512_storeu_ps(c + i, v);
  }
  for (int h = 16; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; j += 16) {
        const __m512 a = _mm512_loadu_ps(c + j);
        const __m512 b = _mm512_loadu_ps(c + j + h);
        _mm512_storeu_ps(c + j, _mm512_add_ps(a, b));
        _mm512_storeu_ps(c + j + h, _mm512_sub_ps(a, b));
      }
    }
  }
  const __m512 sv = _mm512_set1_ps(scale);
  for (int i = 0; i < n; i += 16) {
    _mm512_storeu_ps(c + i, _mm512_mul_ps(_mm512_loadu_ps(c + i), sv));
  }
}

}  // namespace
#endif

void HadamardRotate(float* x, int64_t len, int n) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(n));
#ifdef KVSERVE_OPS_AVX512
  if (n % 16 == 0) {
    for (float* c = x; c < x + len; c += n) HadamardChunkAvx512(c, n, scale);
    return;
  }
#endif
  for (float* c = x; c < x + len; c += n) {
    // log2(n) butterfly passes.
    for (int h = 1; h < n; h *= 2) {
      for (int i = 0; i < n; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const float a = c[j], b = c[j + h];
          c[j] = a + b;
          c[j + h] = a - b;
        }
      }
    }
    for (int j = 0; j < n; ++j) c[j] *= scale;
  }
}

}  // namespace kvserve::models::cpu
