// Division by a run-time constant without a divide instruction (GPUs have
// none: n / d on a run-time d costs ~20 instructions there): the quotient
// is the high half of n * mul, shifted, with mul and shift chosen on the
// host once per divisor (the round-up method of Granlund and Montgomery, as
// in CUTLASS's FastDivmod). Exact for 0 <= n < 2^31 and 1 <= d < 2^31;
// tests/models/fast_div_test.cc checks it against `/`.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KV_FAST_DIV_HD __host__ __device__
#else
#define KV_FAST_DIV_HD
#endif

namespace kvserve::models::cuda {

struct FastDiv {
  int32_t d = 1;
  uint32_t mul = 0;  // 0 for d == 1
  uint32_t shift = 0;

  FastDiv() = default;
  explicit FastDiv(int32_t divisor) : d(divisor) {
    if (d == 1) return;
    uint32_t log2_up = 0;  // ceil(log2(d))
    while ((uint64_t{1} << log2_up) < static_cast<uint64_t>(d)) ++log2_up;
    const uint32_t p = 31 + log2_up;
    mul = static_cast<uint32_t>(((uint64_t{1} << p) + d - 1) /
                                static_cast<uint64_t>(d));
    shift = p - 32;
  }

  KV_FAST_DIV_HD int32_t Div(int32_t n) const {
    if (d == 1) return n;
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(static_cast<uint32_t>(n), mul);
#else
    const uint32_t hi = static_cast<uint32_t>(
        (static_cast<uint64_t>(static_cast<uint32_t>(n)) * mul) >> 32);
#endif
    return static_cast<int32_t>(hi >> shift);
  }
};

}  // namespace kvserve::models::cuda

#undef KV_FAST_DIV_HD
