// int8 KV pages (KvElem::kInt8): llama.cpp's q8_0 encoding (a group of 32
// values shares one fp16 scale d = max|x| / 127, q = round(x / d)), the
// fp16 and bf16 bit conversions it needs in integer operations (the same
// results on every architecture and in the SIMT emulator, where the host
// paths of the CUDA headers' conversions are not trusted under strict
// aliasing at -O2), and where a value and its scale live in a block.
//
// Layout of one block of one plane (block_bytes = B*H*D*17/16, see
// KvBlockBytes in kernels.h):
//   [B][H][D] int8 values, then [B][H][D/32] fp16 scales (little endian)
// Each block's bytes stay contiguous, so block copy (copy-on-write) and
// swap staging, which move whole blocks as bytes, work unchanged; the
// values of one (token, head) row stay contiguous for 8-byte chunk loads.
// The scales start at byte B*H*D of the block, a multiple of 16 when
// B*H*D is a multiple of 256 (which the backend requires, so that every
// block starts 16-byte aligned).
#pragma once

#include <cuda_runtime_api.h>  // __host__, __device__
#include <math.h>              // fabsf, rintf, in device code too

#include <cstdint>
#include <cstring>

namespace kvserve::models::cuda {

inline constexpr int kQ8Group = 32;  // values per fp16 scale

// fp32 -> fp16 bits, round to nearest even, overflow to inf, NaN kept
// (quiet); subnormal results rounded like normal ones. Equal to
// models/cpu/kv_rows.cc's FloatToHalf (ggml's) on every fp16 value, every
// rounding midpoint and one fp32 ulp either side, and every 251st fp32 bit
// pattern (cuda_int8_kv_gpu_test, CudaInt8Kv.Fp16ConversionsMatchCpu).
__host__ __device__ inline uint16_t F32ToF16Bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7C00u);  // inf
  const int e = static_cast<int>(a >> 23) - 127;
  if (e < -14) {
    // Subnormal (or zero): a multiple of 2^-24, rounded to nearest even.
    if (e < -25) return static_cast<uint16_t>(sign);  // below half of 2^-24
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;   // 24-bit significand
    const int shift = -e - 1;                         // 14 .. 24
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);  // q == 0x400: smallest normal
  }
  uint32_t bits = (static_cast<uint32_t>(e + 15) << 10) | ((a >> 13) & 0x3FFu);
  const uint32_t rest = a & 0x1FFFu, half = 0x1000u;
  if (rest > half || (rest == half && (bits & 1u))) ++bits;  // may carry to inf
  return static_cast<uint16_t>(sign | bits);
}

// fp16 bits -> fp32 (exact).
__host__ __device__ inline float F16BitsToF32(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  uint32_t u;
  if (e == 31) {
    u = sign | 0x7F800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else {
    const float mag = static_cast<float>(m) * 5.9604644775390625e-8f;  // 2^-24
    memcpy(&u, &mag, 4);
    u |= sign;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16 bits, round to nearest even (inputs are finite here: the
// product of an int8 and a finite fp16 scale).
__host__ __device__ inline uint32_t F32ToBf16Bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

// The scale of a group whose largest magnitude is amax, and the factor the
// values are multiplied by before rounding: exactly the CPU encoder's
// (models/cpu/kv_rows.cc, llama.cpp's quantize_row_q8_0_ref): the fp32
// d = amax / 127 (IEEE division), 1 / d unrounded to fp16; d is stored as
// fp16.
__host__ __device__ inline float Q8InvScale(float amax) {
  const float d = amax / 127.0f;
  return d != 0.0f ? 1.0f / d : 0.0f;
}

// q = round(x * inv), halves away from zero (lround, as the CPU), clamped
// to [-127, 127] (x * inv never exceeds 127 by more than rounding).
__host__ __device__ inline int8_t Q8Quantize(float x, float inv) {
  const float r = fminf(fmaxf(roundf(x * inv), -127.0f), 127.0f);
  return static_cast<int8_t>(r);
}

// Byte offsets, within a plane, of value d of KV head h of slot `slot`
// (block slot / B, row slot % B), and of its group's fp16 scale.
struct Q8Layout {
  int64_t block_bytes;  // B*H*D*17/16
  int64_t value_bytes;  // B*H*D: where the scales start in a block
  int32_t row_values;   // H*D: one slot's values

  __host__ __device__ Q8Layout(int block_size, int num_kv_heads, int head_dim)
      : block_bytes(static_cast<int64_t>(block_size) * num_kv_heads * head_dim *
                    17 / 16),
        value_bytes(static_cast<int64_t>(block_size) * num_kv_heads * head_dim),
        row_values(num_kv_heads * head_dim) {}

  // value index i = h * D + d within the slot's row of H*D values.
  __host__ __device__ int64_t Value(int64_t block, int row, int i) const {
    return block * block_bytes + static_cast<int64_t>(row) * row_values + i;
  }
  __host__ __device__ int64_t Scale(int64_t block, int row, int i) const {
    return block * block_bytes + value_bytes +
           2 * ((static_cast<int64_t>(row) * row_values + i) / kQ8Group);
  }
};

}  // namespace kvserve::models::cuda
