// Vectorized element-wise and reduction helpers for the CPU forward pass
// (AVX-512 with scalar fallbacks). Single-threaded: callers parallelize over
// rows/heads. Owns no memory; matrix products live in models/cpu/matmul.h.
#pragma once

#include <cstdint>

namespace kvserve::models::cpu {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]. out may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias
// gate or up.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// sum_i a[i] * b[i] (fp32 accumulation).
[[nodiscard]] float Dot(const float* a, const float* b, int64_t n);

// y[i] += a * x[i].
void Axpy(float a, const float* x, float* y, int64_t n);

// In place: x[i] = exp(x[i] - max) / sum_j exp(x[j] - max). -inf entries
// (masked positions) become 0; at least one entry must be finite.
void Softmax(float* x, int64_t n);

// In place, each consecutive n elements of x[0, len): x <- H x, H the
// orthonormal Walsh-Hadamard matrix of order n in Sylvester's order
// (H[i][j] = (-1)^popcount(i & j) / sqrt(n), so H H = I). n is a power of
// two dividing len.
void HadamardRotate(float* x, int64_t len, int n);

}  // namespace kvserve::models::cpu
