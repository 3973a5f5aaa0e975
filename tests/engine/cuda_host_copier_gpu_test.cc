// The CUDA host KV cache's copies (engine/runner/cuda_host_copier.h): a
// block's planes land in its slot in payload order (per layer K, then V)
// and come back into another block unchanged; copies are only done when
// CopyDone says so. Under the SIMT emulator the copy stream is deferred:
// a slot read before CopyDone holds its old bytes, and a staging ring whose
// copies nobody polled refuses more (what a GPU does when PCIe falls
// behind), which a GPU run cannot show on demand.
#include "tests/support/require_gpu.h"

#ifdef KVSERVE_CUDA

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "engine/runner/cuda_host_copier.h"
#include "gtest/gtest.h"
#include "models/cuda/cuda_llama.h"
#include "models/cuda/cuda_status.h"

namespace kvserve::engine {
namespace {

namespace mc = ::kvserve::models::cuda;

constexpr int kPlanes = 4;  // two layers, K and V
constexpr int64_t kBlockBytes = 256;
constexpr int kBlocks = 8;

uint8_t Byte(int plane, int block, int i) {
  return static_cast<uint8_t>(plane * 61 + block * 17 + i * 3 + 1);
}

bool WaitDone(HostKvCopier& c, int64_t ticket) {
  for (int i = 0; i < 1000000; ++i) {
    if (c.CopyDone(ticket)) return true;
  }
  return false;
}

TEST(CudaHostCopier, RoundTripsBlocksThroughPinnedSlots) {
  KV_SKIP_WITHOUT_GPU(testing::HaveGpu());
  mc::DeviceBuffer kv_mem;
  const int64_t plane = kBlocks * kBlockBytes;
  ASSERT_TRUE(kv_mem.Allocate(kPlanes * plane, "kv").ok());
  std::vector<uint8_t> init(kPlanes * plane);
  for (int p = 0; p < kPlanes; ++p) {
    for (int b = 0; b < kBlocks; ++b) {
      for (int i = 0; i < kBlockBytes; ++i) {
        init[p * plane + b * kBlockBytes + i] = Byte(p, b, i);
      }
    }
  }
  ASSERT_EQ(cudaMemcpy(kv_mem.as<void>(), init.data(), init.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  mc::CudaKvCache kv{kBlocks, 16, kv_mem.as<void>(), plane, mc::KvElem::kBf16};
  cudaStream_t model = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&model, cudaStreamNonBlocking),
            cudaSuccess);
  {
    auto c = CreateCudaHostCopier(&kv, kPlanes, kBlockBytes, 6, model);
    ASSERT_TRUE(c.ok()) << c.status();
    HostKvCopier& copier = **c;
    EXPECT_EQ(copier.num_slots(), 6);
    EXPECT_EQ(copier.slot_bytes(), kPlanes * kBlockBytes);
    std::memset(copier.slot(0), 0, copier.slot_bytes());
    auto out = copier.CopyToHost({{3, 0}, {5, 1}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->accepted, 2);
#ifdef KVSERVE_CUDA_EMU
    // Deferred: nothing has landed until someone waits for it.
    EXPECT_EQ(copier.slot(0)[0], 0);
    EXPECT_FALSE(copier.CopyDone(out->ticket));
#endif
    ASSERT_TRUE(WaitDone(copier, out->ticket));
    for (int s = 0; s < 2; ++s) {
      const int block = s == 0 ? 3 : 5;
      for (int p = 0; p < kPlanes; ++p) {
        for (int i = 0; i < kBlockBytes; ++i) {
          ASSERT_EQ(copier.slot(s)[p * kBlockBytes + i], Byte(p, block, i))
              << "slot " << s << " plane " << p << " byte " << i;
        }
      }
    }
    auto in = copier.CopyFromHost({{0, 6}, {1, 7}});
    ASSERT_TRUE(in.ok()) << in.status();
    ASSERT_TRUE(WaitDone(copier, in->ticket));
    std::vector<uint8_t> back(init.size());
    ASSERT_EQ(cudaMemcpy(back.data(), kv_mem.as<void>(), back.size(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int p = 0; p < kPlanes; ++p) {
      for (int i = 0; i < kBlockBytes; ++i) {
        ASSERT_EQ(back[p * plane + 6 * kBlockBytes + i], Byte(p, 3, i));
        ASSERT_EQ(back[p * plane + 7 * kBlockBytes + i], Byte(p, 5, i));
        ASSERT_EQ(back[p * plane + 2 * kBlockBytes + i], Byte(p, 2, i));
      }
    }
    EXPECT_FALSE(copier.CopyToHost({{kBlocks, 0}}).ok());
    EXPECT_FALSE(copier.CopyFromHost({{6, 0}}).ok());
#ifdef KVSERVE_CUDA_EMU
    // Four staging regions, none polled: the fifth store is refused.
    EXPECT_EQ(copier.store_capacity(), 4 * 6);
    int accepted = 0;
    for (int i = 0; i < 5; ++i) {
      auto r = copier.CopyToHost({{i, i}});
      ASSERT_TRUE(r.ok());
      accepted += r->accepted;
    }
    EXPECT_EQ(accepted, 4);
    EXPECT_LT(copier.store_capacity(), 4 * 6);  // regions still busy
#endif
    ASSERT_TRUE(copier.WaitAll().ok());
  }
  ASSERT_EQ(cudaStreamDestroy(model), cudaSuccess);
}

}  // namespace
}  // namespace kvserve::engine

#else  // !KVSERVE_CUDA

TEST(CudaHostCopier, NotBuilt) {
  GTEST_SKIP() << "built without CUDA (KVSERVE_CUDA / KVSERVE_CUDA_EMU)";
}

#endif
