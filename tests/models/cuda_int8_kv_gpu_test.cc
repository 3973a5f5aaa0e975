// int8 KV pages of the CUDA backend (KvElem::kInt8, models/cuda/int8_kv.cuh)
// against the CPU's int8 KV encoder (models/cpu/kv_rows.cc, llama.cpp's
// q8_0): the integer fp16 conversions, and the bytes reshape-and-cache
// stores. Attention over int8 pages: cuda_kernels_gpu_test,
// PagedAttentionInt8Kv. The conversion and layout tests run on the host;
// the reshape-and-cache test is skipped without a device.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#ifdef KVSERVE_CUDA
#include <cuda_runtime.h>

#include "kvcache/kv_sizing.h"
#include "models/cpu/kv_rows.h"
#include "models/cpu/ops.h"
#include "models/cuda/int8_kv.cuh"
#include "models/cuda/kernels.h"
#include "models/model_config.h"
#include "models/rope.h"
#include "tests/support/require_gpu.h"

namespace kvserve::models::cuda {
namespace {

using ::kvserve::testing::HaveGpu;

#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// F32ToF16Bits equals the CPU's FloatToHalf (ggml's) on: every fp16 value,
// every midpoint between neighbours and one fp32 ulp either side (ties to
// even, subnormals, overflow to inf), and a sweep of every 251st fp32 bit
// pattern of both signs (NaN: both quiet NaN). F16BitsToF32 equals
// HalfToFloat on all 65536 codes.
TEST(CudaInt8Kv, Fp16ConversionsMatchCpu) {
  auto check = [](float f) {
    const uint16_t want = cpu::FloatToHalf(f);
    const uint16_t got = F32ToF16Bits(f);
    if (std::isnan(f)) {
      EXPECT_EQ(got & 0x7e00u, 0x7e00u) << f;
    } else {
      ASSERT_EQ(got, want) << std::hexfloat << f;
    }
  };
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float want = cpu::HalfToFloat(static_cast<uint16_t>(h));
    const float got = F16BitsToF32(h);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
      continue;
    }
    uint32_t got_bits, want_bits;  // bit for bit: -0 and subnormals too
    std::memcpy(&got_bits, &got, 4);
    std::memcpy(&want_bits, &want, 4);
    ASSERT_EQ(got_bits, want_bits) << h;
    check(want);
    if ((h & 0x7fffu) >= 0x7c00u) continue;  // inf: no next value
    const float next = cpu::HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = want + (next - want) / 2;  // exact in fp32
    check(mid);
    check(std::nextafter(mid, 0.0f));
    check(std::nextafter(mid, INFINITY));
    check(std::nextafter(mid, -INFINITY));
  }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251) {
    check(BitsToFloat(static_cast<uint32_t>(u)));
  }
}

// The block layout of int8_kv.cuh, spelled out independently: per block
// of B slots, B*H*D int8 values slot-major, then B*H*D/32 fp16 scales.
TEST(CudaInt8Kv, LayoutIsTheDocumentedOne) {
  const int bs = 16, hkv = 8, d = 128;
  const Q8Layout lay(bs, hkv, d);
  const int64_t values = bs * hkv * d;
  EXPECT_EQ(lay.block_bytes, values + values / 32 * 2);
  EXPECT_EQ(lay.block_bytes, KvBlockBytes(KvElem::kInt8, bs, hkv, d));
  EXPECT_EQ(lay.block_bytes * 32, values * 34);  // q8_0: 34 bytes per 32
  for (int64_t blk : {0, 5}) {
    for (int r : {0, 7, 15}) {
      for (int i : {0, 31, 32, 130, hkv * d - 1}) {
        const int64_t start = blk * values * 34 / 32;
        EXPECT_EQ(lay.Value(blk, r, i), start + r * hkv * d + i);
        EXPECT_EQ(lay.Scale(blk, r, i),
                  start + values + 2 * (r * hkv * d / 32 + i / 32));
      }
    }
  }
}

struct QkvCase {
  int h, hkv, d, bs;
  bool rotate;  // bias and random positions: RoPE rotates
};

// Reshape-and-cache's inputs for n tokens of `c` and the CPU's view of them.
struct QkvInputs {
  int64_t n, q_dim, kv_dim, stride;
  int32_t num_slots;
  std::vector<float> qkv, bias;
  std::vector<int32_t> pos, slots;
  // qkv after bias, RoPE and the Hadamard rotation, as the CPU computes it
  std::vector<float> ref;
};

// qkv rows whose 32-value groups have magnitudes from 1e-6 (subnormal fp16
// scales) to 100, and zero groups; n distinct random slots of 64; with
// `c.rotate` a bias of 0.25 and random positions, else position 0.
QkvInputs MakeQkvInputs(const QkvCase& c, const Rope& rope, std::mt19937& rng) {
  QkvInputs in;
  in.n = 13;
  in.q_dim = c.h * c.d;
  in.kv_dim = c.hkv * c.d;
  in.stride = in.q_dim + 2 * in.kv_dim;
  in.num_slots = 64;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  in.qkv.resize(in.n * in.stride);
  for (int64_t i = 0; i < in.n * in.stride; ++i) {
    const int64_t group = i / 32;
    const float mag = group % 7 == 3 ? 0.0f : std::pow(10.0f, group % 9 - 6);
    in.qkv[i] = u(rng) * mag;
  }
  in.bias.assign(in.stride, c.rotate ? 0.25f : 0.0f);
  in.pos.assign(in.n, 0);
  in.slots.resize(in.num_slots);
  std::iota(in.slots.begin(), in.slots.end(), 0);
  std::shuffle(in.slots.begin(), in.slots.end(), rng);
  in.slots.resize(in.n);
  if (c.rotate) {
    for (int64_t i = 0; i < in.n; ++i) in.pos[i] = rng() % 32768;
  }
  in.ref = in.qkv;
  std::vector<float> cs(in.n * c.d / 2), sn(in.n * c.d / 2);
  rope.Tables(in.pos.data(), in.n, cs.data(), sn.data());
  for (int64_t i = 0; i < in.n; ++i) {
    float* row = in.ref.data() + i * in.stride;
    for (int64_t j = 0; j < in.stride; ++j) row[j] += in.bias[j];
    rope.Apply(row, c.h + c.hkv, cs.data() + i * c.d / 2,
               sn.data() + i * c.d / 2);
    // int8 pages store q, K and V Hadamard-rotated (kvcache::KvRotationFor).
    const kvcache::KvRotation rot =
        kvcache::KvRotationFor(kvcache::KvDtype::kInt8, c.d);
    cpu::HadamardRotate(row, in.q_dim + in.kv_dim, rot.k);
    cpu::HadamardRotate(row + in.q_dim + in.kv_dim, in.kv_dim, rot.v);
  }
  return in;
}

// QkvRopeCache on the device into int8 pages of in.num_slots slots; *kb and
// *vb receive the K and V caches' bytes.
void RunQkvRopeCacheInt8(const QkvCase& c, const QkvInputs& in,
                         const Rope& rope, std::vector<unsigned char>* kb,
                         std::vector<unsigned char>* vb) {
  const int64_t cache_bytes =
      in.num_slots / c.bs * Q8Layout(c.bs, c.hkv, c.d).block_bytes;
  float *dqkv, *dbias, *dinv;
  int32_t *dpos, *dslots;
  void *kc, *vc;
  CK(cudaMalloc(&dqkv, in.qkv.size() * 4));
  CK(cudaMalloc(&dbias, in.bias.size() * 4));
  CK(cudaMalloc(&dinv, c.d / 2 * 4));
  CK(cudaMalloc(&dpos, in.n * 4));
  CK(cudaMalloc(&dslots, in.n * 4));
  CK(cudaMalloc(&kc, cache_bytes));
  CK(cudaMalloc(&vc, cache_bytes));
  CK(cudaMemcpy(dqkv, in.qkv.data(), in.qkv.size() * 4,
                cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dbias, in.bias.data(), in.bias.size() * 4,
                cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dinv, rope.inv_freq().data(), c.d / 2 * 4,
                cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dpos, in.pos.data(), in.n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dslots, in.slots.data(), in.n * 4, cudaMemcpyHostToDevice));
  const kvcache::KvRotation rot =
      kvcache::KvRotationFor(kvcache::KvDtype::kInt8, c.d);
  CK(QkvRopeCache(dqkv, in.n, in.stride, c.h, c.hkv, c.d, false, dinv,
                  c.rotate ? dbias : nullptr, dpos, dslots, KvElem::kInt8, c.bs,
                  rot.k, rot.v, kc, vc, nullptr));
  std::vector<float> q(in.qkv.size());
  CK(cudaMemcpy(q.data(), dqkv, q.size() * 4, cudaMemcpyDeviceToHost));
  // q comes back rotated as the CPU rotates it: bit for bit at position 0.
  for (int64_t t = 0; t < in.n; ++t) {
    const float* got = q.data() + t * in.stride;
    const float* want = in.ref.data() + t * in.stride;
    for (int64_t i = 0; i < in.q_dim; ++i) {
      if (c.rotate) {
        EXPECT_NEAR(got[i], want[i], 2e-4f * (1.0f + std::fabs(want[i])))
            << "q, token " << t << " i " << i;
      } else {
        ASSERT_EQ(got[i], want[i]) << "q, token " << t << " i " << i;
      }
    }
  }
  kb->resize(cache_bytes);
  vb->resize(cache_bytes);
  CK(cudaMemcpy(kb->data(), kc, cache_bytes, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(vb->data(), vc, cache_bytes, cudaMemcpyDeviceToHost));
  for (void* p : {static_cast<void*>(dqkv), static_cast<void*>(dbias),
                  static_cast<void*>(dinv), static_cast<void*>(dpos),
                  static_cast<void*>(dslots), kc, vc}) {
    CK(cudaFree(p));
  }
}

// One 32-value group as stored (scale bytes gs, int8 values gq) against the
// CPU encoder's (wg: fp16 scale, then the values). `exact`: every byte
// equal; else each decoded value within 1.01 scales of the CPU's. Counts
// the values and those equal to the CPU's.
void CompareGroup(const unsigned char* wg, const unsigned char* gs,
                  const unsigned char* gq, bool exact, const std::string& where,
                  int64_t* values, int64_t* same) {
  const float ws = cpu::HalfToFloat(wg[0] | (wg[1] << 8));
  const float gsf = cpu::HalfToFloat(gs[0] | (gs[1] << 8));
  if (exact) {
    ASSERT_EQ(std::memcmp(gs, wg, 2), 0) << "scale, " << where;
  }
  for (int j = 0; j < kQ8Group; ++j) {
    const int wq = static_cast<int8_t>(wg[2 + j]);
    const int gq8 = static_cast<int8_t>(gq[j]);
    ++*values;
    *same += wq == gq8;
    if (exact) {
      ASSERT_EQ(gq8, wq) << where << " + " << j;
    }
    EXPECT_LE(std::fabs(gq8 * gsf - wq * ws), 1.01f * ws + 1e-12f)
        << where << " + " << j;
  }
}

// Every group of every token's K and V rows in the caches' bytes kb, vb
// against the CPU encoder's encoding of in.ref.
void CompareStoredRows(const QkvCase& c, const QkvInputs& in,
                       const std::vector<unsigned char>& kb,
                       const std::vector<unsigned char>& vb, int64_t* values,
                       int64_t* same) {
  const Q8Layout lay(c.bs, c.hkv, c.d);
  std::vector<std::byte> row(kvcache::KvRowBytes(kvcache::KvDtype::kInt8, c.d));
  for (int64_t t = 0; t < in.n; ++t) {
    const int64_t blk = in.slots[t] / c.bs;
    const int r = in.slots[t] % c.bs;
    for (int kv = 0; kv < 2; ++kv) {
      const unsigned char* got = (kv == 0 ? kb : vb).data();
      for (int h = 0; h < c.hkv; ++h) {
        const float* x = in.ref.data() + t * in.stride + in.q_dim +
                         kv * in.kv_dim + static_cast<int64_t>(h) * c.d;
        cpu::EncodeKvRow(kvcache::KvDtype::kInt8, x, c.d, row.data());
        const auto* want = reinterpret_cast<const unsigned char*>(row.data());
        for (int g = 0; g < c.d / kQ8Group; ++g) {
          const int i = h * c.d + g * kQ8Group;
          CompareGroup(want + g * (kQ8Group + 2), got + lay.Scale(blk, r, i),
                       got + lay.Value(blk, r, i), !c.rotate,
                       "t " + std::to_string(t) + " kv " + std::to_string(kv) +
                           " i " + std::to_string(i),
                       values, same);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// Reshape-and-cache into int8 pages. At position 0 without bias RoPE is the
// identity (cos 1, sin 0), so K and V reach the encoder exactly as the CPU
// sees them: every byte (values and fp16 scales) equals the CPU encoder's.
// At other positions the rotation may differ from the CPU's in the last
// fp32 bit, so a value may land one quantum away: each decoded value is
// within 1.01 scales of the CPU encoder's, and at least 99% of the int8
// values are identical (measured: 100% on these inputs).
TEST(CudaInt8Kv, QkvRopeCacheStoresTheCpuEncoding) {
  KV_SKIP_WITHOUT_GPU(HaveGpu());
  std::mt19937 rng(21);
  for (const QkvCase& shape :
       {QkvCase{9, 3, 64, 16, false}, QkvCase{32, 8, 128, 16, false},
        QkvCase{8, 1, 64, 4, false}}) {
    for (bool rotate : {false, true}) {
      QkvCase c = shape;
      c.rotate = rotate;
      ModelConfig mc;
      mc.head_dim = c.d;
      mc.rope_theta = 500000.0f;
      mc.rope_style = RopeStyle::kHalfSplit;
      const Rope rope(mc);
      const QkvInputs in = MakeQkvInputs(c, rope, rng);
      std::vector<unsigned char> kb, vb;
      ASSERT_NO_FATAL_FAILURE(RunQkvRopeCacheInt8(c, in, rope, &kb, &vb));
      int64_t values = 0, same = 0;
      ASSERT_NO_FATAL_FAILURE(CompareStoredRows(c, in, kb, vb, &values, &same));
      EXPECT_GE(same, values * 99 / 100) << "rotate " << rotate;
      std::printf(
          "int8 reshape-and-cache (H %d Hkv %d D %d, rotate %d): "
          "%lld of %lld values equal the CPU encoder's\n",
          c.h, c.hkv, c.d, rotate, static_cast<long long>(same),
          static_cast<long long>(values));
    }
  }
}

}  // namespace
}  // namespace kvserve::models::cuda

#else

TEST(CudaInt8Kv, NotBuilt) {
  GTEST_SKIP() << "built without CUDA (KVSERVE_CUDA=OFF)";
}

#endif  // KVSERVE_CUDA
