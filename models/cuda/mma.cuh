// One warp-wide tensor-core product, D = A * B + C for an m16n8k16 tile with
// bf16 A and B and fp32 C and D (mma.sync, sm_80 and later). Each lane
// holds fragments laid out as the PTX ISA's "Matrix Fragments for
// mma.m16n8k16 with floating point type" says, with g = lane / 4 and
// t = lane % 4 (a 32-bit register holds two bf16, the lower index in the
// low half):
//   a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
//   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
//   c[0..1] = C[g][2t, 2t+1]  c[2..3] = C[g+8][2t, 2t+1]   (same for d)
// Under the SIMT emulator the warp's fragments are gathered and the product
// computed on the CPU from these same layouts.
#pragma once

#include <cstdint>
#include <cstring>

#include "models/cuda/kernels.h"

namespace kvserve::models::cuda {

__device__ inline void MmaBf16M16N8K16(float d[4], const uint32_t a[4],
                                       const uint32_t b[2], const float c[4]) {
#if defined(KVSERVE_CUDA_EMU)
  struct Frag {
    uint32_t a[4], b[2];
  };
  Frag mine;
  std::memcpy(mine.a, a, sizeof(mine.a));
  std::memcpy(mine.b, b, sizeof(mine.b));
  Frag all[32];
  ::kvserve::cuda_emu::WarpAllGather(&mine, sizeof(Frag), all);
  const auto f32 = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  const auto lo = [&](uint32_t v) { return f32(v << 16); };
  const auto hi = [&](uint32_t v) { return f32(v & 0xffff0000u); };
  float am[16][16], bm[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    const Frag& f = all[lane];
    for (int r = 0; r < 2; ++r) {    // rows g, g + 8
      for (int h = 0; h < 2; ++h) {  // columns 2t.., 2t + 8..
        const uint32_t v = f.a[r + 2 * h];
        am[g + 8 * r][2 * t + 8 * h] = lo(v);
        am[g + 8 * r][2 * t + 8 * h + 1] = hi(v);
      }
    }
    for (int h = 0; h < 2; ++h) {
      bm[2 * t + 8 * h][g] = lo(f.b[h]);
      bm[2 * t + 8 * h + 1][g] = hi(f.b[h]);
    }
  }
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float acc = c[i];
    for (int k = 0; k < 16; ++k) acc += am[row][k] * bm[k][col];
    d[i] = acc;
  }
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
        "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}

// Two bf16 as one 32-bit fragment register: `lo` in the low half.
__device__ inline uint32_t PackBf16(bf16 lo, bf16 hi) {
  uint16_t l, h;
  std::memcpy(&l, &lo, 2);
  std::memcpy(&h, &hi, 2);
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}

}  // namespace kvserve::models::cuda
