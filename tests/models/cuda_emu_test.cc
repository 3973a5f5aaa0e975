// The SIMT emulator's own contract (tests/support/cuda_emu/, KVSERVE_CUDA_EMU
// builds only; elsewhere the file compiles to no tests): barriers and warp
// shuffles exchange values like a GPU, a barrier some threads never reach is
// reported, launch limits and copies outside an allocation fail with the CUDA
// runtime's errors, and fresh device memory is NaN garbage, not zeros.
#if defined(KVSERVE_CUDA_EMU)
#include "tests/support/cuda_emu/simt.h"  // first: before any CUDA header
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

#if defined(KVSERVE_CUDA_EMU)
#include "models/cuda/launch.h"

namespace kvserve::cuda_emu {
namespace {

// out[b] = sum over the block of (b * 1000 + thread): a warp-shuffle
// reduction, then one across warps through shared memory.
__global__ void BlockSum(float* out) {
  __shared__ float warp_sums[32];
  float v = static_cast<float>(blockIdx.x * 1000 + threadIdx.x);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += warp_sums[w];
    out[blockIdx.x] = s;
  }
}

// Thread t writes smem[t]; after the barrier it reads its neighbour's.
__global__ void Rotate(int* out) {
  KV_DYNAMIC_SMEM(int, buf);
  const int n = static_cast<int>(blockDim.x);
  buf[threadIdx.x] = static_cast<int>(threadIdx.x) * 3;
  __syncthreads();
  out[threadIdx.x] = buf[(threadIdx.x + 1) % n];
}

// Only the first half of the block reaches the barrier: a hang on a GPU.
__global__ void Divergent(int* out) {
  if (threadIdx.x < blockDim.x / 2) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void Nop(int* /*out*/) {}

TEST(CudaEmu, ShufflesAndBarriersExchangeValues) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 3 * sizeof(float)), cudaSuccess);
  KV_LAUNCH(3, 256, 0, nullptr, BlockSum)(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> h(3);
  ASSERT_EQ(cudaMemcpy(h.data(), d, 3 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(h[b], 256.0f * b * 1000 + 255.0f * 256 / 2) << "block " << b;
  }
  int* r = nullptr;
  ASSERT_EQ(cudaMalloc(&r, 96 * sizeof(int)), cudaSuccess);
  KV_LAUNCH(1, 96, 96 * sizeof(int), nullptr, Rotate)(r);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> hr(96);
  ASSERT_EQ(cudaMemcpy(hr.data(), r, 96 * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int t = 0; t < 96; ++t) EXPECT_EQ(hr[t], (t + 1) % 96 * 3);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(r), cudaSuccess);
}

TEST(CudaEmu, DivergentBarrierIsALaunchFailure) {
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(int)), cudaSuccess);
  KV_LAUNCH(1, 64, 0, nullptr, Divergent)(d);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST(CudaEmu, LaunchLimitsAreTheRuntimes) {
  KV_LAUNCH(1, 2048, 0, nullptr, Nop)(nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  const dim3 too_tall(1, 70000);
  KV_LAUNCH(too_tall, 32, 0, nullptr, Nop)(nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  // Over 48 KiB of dynamic shared memory needs the kernel's opt-in.
  KV_LAUNCH(1, 32, 64 * 1024, nullptr, Rotate)(nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(
                Rotate, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024),
            cudaSuccess);
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 32 * sizeof(int)), cudaSuccess);
  KV_LAUNCH(1, 32, 64 * 1024, nullptr, Rotate)(d);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
}

TEST(CudaEmu, DeviceMemoryIsCheckedAndStartsAsGarbage) {
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 16 * sizeof(float)), cudaSuccess);
  std::vector<float> h(17, 1.0f);
  ASSERT_EQ(cudaMemcpy(h.data(), d, 16 * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isnan(h[i])) << i;
  EXPECT_EQ(cudaMemcpy(d, h.data(), 17 * sizeof(float), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemset(d + 8, 0, 9 * sizeof(float)), cudaErrorInvalidValue);
  EXPECT_EQ(
      cudaMemcpy(h.data(), d + 1, 16 * sizeof(float), cudaMemcpyDeviceToHost),
      cudaErrorInvalidValue);
  (void)cudaGetLastError();
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(d), cudaErrorInvalidValue);  // double free
  (void)cudaGetLastError();
}

}  // namespace
}  // namespace kvserve::cuda_emu

#endif  // KVSERVE_CUDA_EMU
