// Timing helpers shared by the GPU benchmarks (cuda_gpu_bench.cc, and
// attention_gpu_bench.cu, which device_bench.sh builds with nvcc alone):
// a checked-call macro, event timing of back-to-back calls, the device's
// copy bandwidth, and the "must have a GPU" switch of device runs.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define GPU_BENCH_CHECK(expr)                                           \
  do {                                                                  \
    const cudaError_t e_ = (expr);                                      \
    if (e_ != cudaSuccess) {                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(e_));                             \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

namespace kvserve::gpu_bench {

// True when a device is visible. Without one the benchmark prints `name`'s
// notice and should exit 0, unless KVSERVE_REQUIRE_GPU=1 (device_bench.sh
// sets it: there, no device is a failure, not a pass).
inline bool HaveDeviceOrExplain(const char* name) {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
  const char* req = std::getenv("KVSERVE_REQUIRE_GPU");
  const bool required = req != nullptr && req[0] == '1';
  std::printf("%s: no CUDA device visible%s\n", name,
              required ? " (KVSERVE_REQUIRE_GPU=1: failing)" : "");
  if (required) std::exit(1);
  return false;
}

// Median seconds per call of fn(i): after `warmup` calls, `reps` times
// `calls` back-to-back calls between one pair of events, so the host's
// launch gap before the first call stays out of the figure. fn(i) gets a
// running index (rotate inputs with it so that L2 does not serve them).
template <typename Fn>
double MedianSecondsPerCall(int warmup, int reps, int calls, Fn fn) {
  cudaEvent_t a, b;
  GPU_BENCH_CHECK(cudaEventCreate(&a));
  GPU_BENCH_CHECK(cudaEventCreate(&b));
  int i = 0;
  for (; i < warmup; ++i) fn(i);
  GPU_BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    GPU_BENCH_CHECK(cudaEventRecord(a));
    for (int c = 0; c < calls; ++c) fn(i++);
    GPU_BENCH_CHECK(cudaEventRecord(b));
    GPU_BENCH_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    GPU_BENCH_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e-3 / calls);
  }
  GPU_BENCH_CHECK(cudaEventDestroy(a));
  GPU_BENCH_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Device-to-device copy bandwidth in bytes/s (bytes read + written) of a
// `bytes` copy between two buffers far larger than L2, filled with a
// non-zero pattern.
inline double CopyBandwidth(size_t bytes) {
  void *src = nullptr, *dst = nullptr;
  GPU_BENCH_CHECK(cudaMalloc(&src, bytes));
  GPU_BENCH_CHECK(cudaMalloc(&dst, bytes));
  GPU_BENCH_CHECK(cudaMemset(src, 0x3c, bytes));
  const double t = MedianSecondsPerCall(3, 10, 1, [&](int) {
    GPU_BENCH_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
  });
  GPU_BENCH_CHECK(cudaFree(src));
  GPU_BENCH_CHECK(cudaFree(dst));
  return 2.0 * static_cast<double>(bytes) / t;
}

}  // namespace kvserve::gpu_bench
