// The `gpu` tests skip without a CUDA device, except where
// KVSERVE_REQUIRE_GPU=1 (tools/device_bench.sh sets it on a GPU machine):
// there a missing device fails the test instead of passing it silently.
#pragma once

#include <cstdlib>

#include "gtest/gtest.h"

#ifdef KVSERVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kvserve::testing {
#ifdef KVSERVE_CUDA
// Whether the CUDA runtime sees a device (the SIMT emulator counts as one).
inline bool HaveGpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}
#endif
inline bool GpuRequired() {
  const char* v = std::getenv("KVSERVE_REQUIRE_GPU");
  return v != nullptr && v[0] == '1';
}
}  // namespace kvserve::testing

#define KV_SKIP_WITHOUT_GPU(have_gpu)                                 \
  do {                                                                \
    if (!(have_gpu)) {                                                \
      if (::kvserve::testing::GpuRequired()) {                        \
        FAIL() << "no CUDA device visible and KVSERVE_REQUIRE_GPU=1"; \
      }                                                               \
      GTEST_SKIP() << "no CUDA device visible";                       \
    }                                                                 \
  } while (0)
