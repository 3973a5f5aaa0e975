// fp8 e4m3 <-> fp32 / bf16 bits for the KV pages (KvElem::kFp8E4M3), in
// integer operations: the same results on every architecture and in the
// SIMT emulator, where the host paths of the CUDA headers' fp8 conversions
// miscompile under strict aliasing at -O2. e4m3: sign, 4 exponent bits
// (bias 7), 3 mantissa bits; largest finite 448, 0x7f / 0xff are NaN.
#pragma once

#include <cuda_runtime_api.h>  // __host__, __device__
#include <math.h>              // rintf, in device code too

#include <cstdint>
#include <cstring>

namespace kvserve::models::cuda {

// Round to nearest even, saturating to +-448 (inf too); NaN stays NaN.
__host__ __device__ inline uint8_t F32ToFp8Bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);   // NaN
  if (a >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // 448
  const int e = static_cast<int>(a >> 23) - 127;
  if (e < -6) {  // subnormal: a multiple of 2^-9 (8 * 2^-9 is 2^-6, normal)
    float mag;
    memcpy(&mag, &a, 4);
    const uint32_t m = static_cast<uint32_t>(rintf(mag * 512.0f));
    return static_cast<uint8_t>(sign | m);
  }
  uint32_t bits = (static_cast<uint32_t>(e + 7) << 3) | ((a >> 20) & 7u);
  const uint32_t rest = a & 0xFFFFFu, half = 0x80000u;
  if (rest > half || (rest == half && (bits & 1u))) ++bits;
  if (bits > 0x7Eu) bits = 0x7Eu;
  return static_cast<uint8_t>(sign | bits);
}

// The bf16 bits of e4m3 value `b` (exact: bf16 has more exponent and
// mantissa bits).
__host__ __device__ inline uint32_t Fp8ToBf16Bits(uint32_t b) {
  const uint32_t sign = (b & 0x80u) << 8;
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  if (e == 15 && m == 7) return sign | 0x7FC0u;  // NaN
  if (e != 0) return sign | ((e + 120u) << 7) | (m << 4);
  if (m == 0) return sign;
  // Subnormal m * 2^-9: m = 2^p (1 + f), p = floor(log2 m).
  const uint32_t p = m >= 4 ? 2u : (m >= 2 ? 1u : 0u);
  return sign | ((118u + p) << 7) | ((m - (1u << p)) << (7u - p));
}

}  // namespace kvserve::models::cuda
