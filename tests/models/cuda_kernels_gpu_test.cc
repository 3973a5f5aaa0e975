// Each CUDA kernel of models/cuda/ against the CPU reference on fresh random
// inputs (RMSNorm + residual, SiLU-mul, embedding, bias + RoPE + cache write
// in both RoPE styles, paged attention for decode / prefill / mixed batches
// with shuffled block tables, split-K, sliding windows, KV block copy).
// Outputs are poisoned with NaN first so unwritten elements fail. bf16
// results within 1e-2 relative, fp32 within 1e-4. Skipped without a device.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

#ifdef KVSERVE_CUDA
#include <cuda_runtime.h>

#include "models/cpu/kv_rows.h"
#include "models/cpu/ops.h"
#include "models/cpu/paged_attention.h"
#include "models/cuda/fp8.cuh"
#include "models/cuda/int8_kv.cuh"
#include "models/cuda/kernels.h"
#include "models/forward_batch.h"
#include "models/kv_view.h"
#include "models/model_config.h"
#include "models/rope.h"
#include "tests/support/require_gpu.h"

namespace kvserve::models::cuda {
namespace {

using ::kvserve::testing::HaveGpu;

#define SKIP_WITHOUT_GPU() KV_SKIP_WITHOUT_GPU(HaveGpu())
#define CK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

uint16_t ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16Bits(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// fp8 e4m3 bits of f (the kernels' own rounding: models/cuda/fp8.cuh), and
// their value by the format's definition, independently of that header.
uint8_t ToFp8Bits(float f) { return F32ToFp8Bits(f); }
float FromFp8Bits(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const float mag =
      e == 0 ? std::ldexp(m / 8.0f, -6) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// A device array that is freed on scope exit; Poison() fills it with NaN.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(std::max<size_t>(n, 1)) {
    EXPECT_EQ(cudaMalloc(&p_, n_ * sizeof(T)), cudaSuccess);
  }
  ~Dev() { (void)cudaFree(p_); }
  T* get() const { return p_; }
  void Poison() {
    EXPECT_EQ(cudaMemset(p_, 0xff, n_ * sizeof(T)), cudaSuccess);
  }
  void Up(const std::vector<T>& v) {
    EXPECT_EQ(
        cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  std::vector<T> Down(size_t n) const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -1.0f,
                          float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<float> ToFloat(const std::vector<uint16_t>& h) {
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = FromBf16Bits(h[i]);
  return f;
}

// The first n values of a KV cache array: bf16, or fp8 bytes.
std::vector<float> CacheToFloat(const Dev<uint16_t>& d, size_t n, bool fp8) {
  if (!fp8) return ToFloat(d.Down(n));
  const std::vector<uint16_t> raw = d.Down((n + 1) / 2);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    f[i] = FromFp8Bits(reinterpret_cast<const uint8_t*>(raw.data())[i]);
  }
  return f;
}

// Multiplies each 32-value group of x (one int8 scale's values) by its own
// factor 10^u, u uniform in [-2, 1]: neighbouring scales differ by up to
// 1000x, so a value dequantized with another group's scale is off by O(1).
void SpreadGroupMagnitudes(std::vector<float>* x, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 1.0f);
  for (size_t g = 0; g < x->size() / kQ8Group; ++g) {
    const float f = std::pow(10.0f, u(rng));
    for (int j = 0; j < kQ8Group; ++j) (*x)[g * kQ8Group + j] *= f;
  }
}

// int8 pages of `slots` slots of hkv * d values x (slot-major), in blocks
// of bs slots (int8_kv.cuh's layout), encoded by the CPU's int8 KV encoder
// (llama.cpp's q8_0); x becomes what the attention's tile loader reads:
// each q * scale rounded to bf16.
std::vector<uint16_t> PackQ8(std::vector<float>* x, int64_t slots, int bs,
                             int hkv, int d) {
  const Q8Layout lay(bs, hkv, d);
  std::vector<uint16_t> out((slots / bs * lay.block_bytes + 1) / 2);
  auto* bytes = reinterpret_cast<unsigned char*>(out.data());
  std::vector<std::byte> row(kvcache::KvRowBytes(kvcache::KvDtype::kInt8, d));
  for (int64_t s = 0; s < slots; ++s) {
    for (int h = 0; h < hkv; ++h) {
      float* xr = x->data() + (s * hkv + h) * d;
      cpu::EncodeKvRow(kvcache::KvDtype::kInt8, xr, d, row.data());
      for (int g = 0; g < d / kQ8Group; ++g) {
        const unsigned char* b =
            reinterpret_cast<unsigned char*>(row.data()) + g * (kQ8Group + 2);
        const int i = h * d + g * kQ8Group;
        std::memcpy(bytes + lay.Scale(s / bs, s % bs, i), b, 2);
        std::memcpy(bytes + lay.Value(s / bs, s % bs, i), b + 2, kQ8Group);
        const float scale = cpu::HalfToFloat(b[0] | (b[1] << 8));
        for (int j = 0; j < kQ8Group; ++j) {
          xr[g * kQ8Group + j] = FromBf16Bits(ToBf16Bits(
              static_cast<float>(static_cast<int8_t>(b[2 + j])) * scale));
        }
      }
    }
  }
  return out;
}

// ||got - want|| / ||want|| over [off, off + n); NaN compares as failure.
double RelErr(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

int NumSms() {
  int dev = 0, sms = 1;
  (void)cudaGetDevice(&dev);
  (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

// The fp8 e4m3 conversions of the KV pages against the format's
// definition: every code decodes exactly (bf16 bits), every finite code
// survives a round trip, ties round to even, out-of-range values saturate.
TEST(CudaKernels, Fp8ConversionsFollowTheFormat) {
  for (uint32_t b = 0; b < 256; ++b) {
    const float want = FromFp8Bits(static_cast<uint8_t>(b));
    const float got = FromBf16Bits(static_cast<uint16_t>(Fp8ToBf16Bits(b)));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    EXPECT_EQ(got, want) << b;
    EXPECT_EQ(F32ToFp8Bits(want), b) << want;
  }
  EXPECT_EQ(F32ToFp8Bits(1e6f), 0x7e);
  EXPECT_EQ(F32ToFp8Bits(-INFINITY), 0xfe);
  EXPECT_EQ(F32ToFp8Bits(460.0f), 0x7e);
  EXPECT_EQ(F32ToFp8Bits(1.0625f), 0x38);    // 1 + 1/16: tie, to even (1.0)
  EXPECT_EQ(F32ToFp8Bits(1.1875f), 0x3a);    // 1 + 3/16: tie, to even (1.25)
  EXPECT_EQ(F32ToFp8Bits(0x1p-10f), 0x00);   // half of 2^-9: tie, to 0
  EXPECT_EQ(F32ToFp8Bits(0x1.8p-9f), 0x02);  // 1.5 * 2^-9: tie, to 2
  EXPECT_TRUE(std::isnan(FromFp8Bits(F32ToFp8Bits(NAN))));
}

TEST(CudaKernels, AddRmsNormMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  for (int64_t hidden : {64, 576, 4096}) {
    for (int64_t rows : {1, 7, 33}) {
      const std::vector<float> x = Random(rows * hidden, rng);
      const std::vector<float> delta = Random(rows * hidden, rng);
      const std::vector<float> w = Random(hidden, rng, 0.5f, 1.5f);
      std::vector<float> sum(rows * hidden), ref(rows * hidden);
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + delta[i];
      for (int64_t r = 0; r < rows; ++r) {
        cpu::RmsNorm(sum.data() + r * hidden, w.data(), hidden, 1e-5f,
                     ref.data() + r * hidden);
      }
      Dev<float> dx(x.size()), dd(delta.size()), dw(w.size()), out(x.size());
      dx.Up(x);
      dd.Up(delta);
      dw.Up(w);
      out.Poison();
      CK(AddRmsNorm(dx.get(), dd.get(), dw.get(), rows, hidden, 1e-5f, nullptr,
                    out.get(), nullptr));
      const std::vector<float> got = out.Down(x.size());
      EXPECT_LT(RelErr(got.data(), ref.data(), got.size()), 1e-4)
          << "hidden " << hidden << " rows " << rows;
      EXPECT_EQ(dx.Down(x.size()), sum) << "residual add stored back";
      // bf16 output, gathered rows (reverse order), no store-back.
      Dev<bf16> outh(x.size());
      outh.Poison();
      std::vector<int32_t> idx(rows);
      std::iota(idx.rbegin(), idx.rend(), 0);
      Dev<int32_t> didx(rows);
      didx.Up(idx);
      dx.Up(x);
      CK(AddRmsNorm(dx.get(), dd.get(), dw.get(), rows, hidden, 1e-5f,
                    didx.get(), outh.get(), nullptr));
      std::vector<uint16_t> raw(x.size());
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(raw.data(), outh.get(), raw.size() * 2,
                    cudaMemcpyDeviceToHost));
      const std::vector<float> goth = ToFloat(raw);
      for (int64_t i = 0; i < rows; ++i) {
        EXPECT_LT(RelErr(goth.data() + i * hidden, ref.data() + idx[i] * hidden,
                         hidden),
                  1e-2);
      }
      EXPECT_EQ(dx.Down(x.size()), x) << "gathered rows must not store back";
    }
  }
}

TEST(CudaKernels, SiluMulAndEmbeddingMatchCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  for (int64_t inter : {1536, 14336}) {
    const int64_t rows = 5;
    const std::vector<float> gu = Random(rows * 2 * inter, rng, -6.0f, 6.0f);
    std::vector<float> ref(rows * inter);
    for (int64_t r = 0; r < rows; ++r) {
      cpu::SiluMul(gu.data() + r * 2 * inter, gu.data() + r * 2 * inter + inter,
                   inter, ref.data() + r * inter);
    }
    Dev<float> dgu(gu.size());
    Dev<bf16> out(ref.size());
    dgu.Up(gu);
    out.Poison();
    CK(SiluMul(dgu.get(), rows, inter, out.get(), nullptr));
    std::vector<uint16_t> raw(ref.size());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(raw.data(), out.get(), raw.size() * 2,
                  cudaMemcpyDeviceToHost));
    EXPECT_LT(RelErr(ToFloat(raw).data(), ref.data(), ref.size()), 1e-2);
  }
  // Embedding gather is exact (bf16 -> fp32).
  const int64_t vocab = 1000, hidden = 576;
  std::vector<uint16_t> table(vocab * hidden);
  for (uint16_t& h : table)
    h = ToBf16Bits(std::uniform_real_distribution<float>(-1, 1)(rng));
  const std::vector<int32_t> ids = {5, 999, 0, 5, 123};
  Dev<uint16_t> dt(table.size());
  Dev<int32_t> dids(ids.size());
  Dev<float> x(ids.size() * hidden);
  dt.Up(table);
  dids.Up(ids);
  x.Poison();
  CK(EmbeddingGather(reinterpret_cast<const bf16*>(dt.get()), dids.get(),
                     ids.size(), hidden, x.get(), nullptr));
  const std::vector<float> got = x.Down(ids.size() * hidden);
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t j = 0; j < hidden; ++j) {
      ASSERT_EQ(got[t * hidden + j], FromBf16Bits(table[ids[t] * hidden + j]));
    }
  }
}

// Bias + RoPE (both styles) + reshape-and-cache for several head shapes.
TEST(CudaKernels, QkvRopeCacheMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  struct Case {
    int h, hkv, d;
  };
  for (const Case& c :
       {Case{9, 3, 64}, Case{32, 8, 128}, Case{64, 8, 128}, Case{8, 8, 64}}) {
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalfSplit}) {
      for (bool with_bias : {false, true}) {
        ModelConfig mc;
        mc.head_dim = c.d;
        mc.rope_theta = 500000.0f;
        mc.rope_style = style;
        const Rope rope(mc);
        const int64_t n = 13, q_dim = c.h * c.d, kv_dim = c.hkv * c.d;
        const int64_t stride = q_dim + 2 * kv_dim;
        const int32_t num_slots = 64;
        std::vector<float> qkv = Random(n * stride, rng);
        const std::vector<float> bias = Random(stride, rng);
        std::vector<int32_t> pos(n), slots(num_slots);
        std::iota(slots.begin(), slots.end(), 0);
        std::shuffle(slots.begin(), slots.end(), rng);
        slots.resize(n);
        for (int64_t i = 0; i < n; ++i) pos[i] = rng() % 32768;
        // CPU reference.
        std::vector<float> ref = qkv;
        std::vector<float> cs(n * c.d / 2), sn(n * c.d / 2);
        rope.Tables(pos.data(), n, cs.data(), sn.data());
        for (int64_t i = 0; i < n; ++i) {
          float* row = ref.data() + i * stride;
          if (with_bias) {
            for (int64_t j = 0; j < stride; ++j) row[j] += bias[j];
          }
          rope.Apply(row, c.h + c.hkv, cs.data() + i * c.d / 2,
                     sn.data() + i * c.d / 2);
        }
        Dev<float> dqkv(qkv.size()), dbias(bias.size()), dinv(c.d / 2);
        Dev<int32_t> dpos(n), dslots(n);
        dbias.Up(bias);
        dinv.Up(rope.inv_freq());
        dpos.Up(pos);
        dslots.Up(slots);
        for (const KvElem elem : {KvElem::kBf16, KvElem::kFp8E4M3}) {
          const bool f8 = elem == KvElem::kFp8E4M3;
          Dev<uint16_t> kc(num_slots * kv_dim), vc(num_slots * kv_dim);
          dqkv.Up(qkv);
          kc.Poison();
          vc.Poison();
          CK(QkvRopeCache(dqkv.get(), n, stride, c.h, c.hkv, c.d,
                          style == RopeStyle::kInterleaved, dinv.get(),
                          with_bias ? dbias.get() : nullptr, dpos.get(),
                          dslots.get(), elem, 16, 0, 0, kc.get(), vc.get(),
                          nullptr));
          const std::vector<float> got = dqkv.Down(qkv.size());
          const std::vector<float> k = CacheToFloat(kc, num_slots * kv_dim, f8);
          const std::vector<float> v = CacheToFloat(vc, num_slots * kv_dim, f8);
          // Rounding to bf16 costs 2^-9 of each value, to fp8 e4m3 2^-4.
          const double tol = f8 ? 4e-2 : 1e-2;
          for (int64_t i = 0; i < n; ++i) {
            const float* want = ref.data() + i * stride;
            EXPECT_LT(RelErr(got.data() + i * stride, want, q_dim), 1e-4)
                << "q, token " << i << " heads " << c.h;
            EXPECT_LT(
                RelErr(k.data() + slots[i] * kv_dim, want + q_dim, kv_dim), tol)
                << "k, token " << i << " fp8 " << f8;
            EXPECT_LT(RelErr(v.data() + slots[i] * kv_dim,
                             want + q_dim + kv_dim, kv_dim),
                      tol)
                << "v, token " << i << " fp8 " << f8;
          }
        }
      }
    }
  }
}

struct AttnCase {
  int h, hkv, d, block_size, window;
  // (new tokens, context length) per sequence.
  std::vector<std::pair<int, int>> seqs;
  int num_sms;  // 0: the device's (a large value forces split-K)
  AttnTuning tuning = {};
  KvElem elem = KvElem::kBf16;  // the caches' element type
};

void RunAttention(const AttnCase& c, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "H " << c.h << " Hkv " << c.hkv << " D " << c.d << " B "
               << c.block_size << " window " << c.window << " seqs "
               << c.seqs.size() << " first ctx " << c.seqs[0].second);
  const int bs = c.block_size;
  ForwardBatch b;
  int max_blocks = 0, total_blocks = 0;
  for (auto [n, ctx] : c.seqs) {
    max_blocks = std::max(max_blocks, (ctx + bs - 1) / bs);
    total_blocks += (ctx + bs - 1) / bs;
  }
  const int num_blocks = total_blocks + 3;
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  b.max_blocks_per_seq = max_blocks;
  b.seq_starts = {0};
  int next = 0;
  for (auto [n, ctx] : c.seqs) {
    const int nb = (ctx + bs - 1) / bs;
    std::vector<int32_t> row(max_blocks, 0);
    std::copy(pool.begin() + next, pool.begin() + next + nb, row.begin());
    next += nb;
    for (int j = 0; j < n; ++j) {
      const int pos = ctx - n + j;
      b.token_ids.push_back(0);
      b.positions.push_back(pos);
      b.slot_mapping.push_back(row[pos / bs] * bs + pos % bs);
    }
    b.seq_starts.push_back(b.token_ids.size());
    b.context_lens.push_back(ctx);
    b.block_tables.insert(b.block_tables.end(), row.begin(), row.end());
  }
  ASSERT_TRUE(b.Validate(num_blocks, bs, 1).ok());
  const int64_t t = b.num_tokens();
  const int64_t slot_elems = static_cast<int64_t>(c.hkv) * c.d;
  const int64_t cache_elems =
      static_cast<int64_t>(num_blocks) * bs * slot_elems;
  std::vector<float> kf = Random(cache_elems, rng),
                     vf = Random(cache_elems, rng);
  // The caches' bytes (bf16, fp8, or int8 pages), and the same values in fp32
  // for the reference.
  const bool f8 = c.elem == KvElem::kFp8E4M3;
  const bool q8 = c.elem == KvElem::kInt8;
  std::vector<uint16_t> kh(q8 ? 0 : cache_elems), vh(q8 ? 0 : cache_elems);
  if (q8) {
    SpreadGroupMagnitudes(&kf, rng);
    SpreadGroupMagnitudes(&vf, rng);
    kh = PackQ8(&kf, static_cast<int64_t>(num_blocks) * bs, bs, c.hkv, c.d);
    vh = PackQ8(&vf, static_cast<int64_t>(num_blocks) * bs, bs, c.hkv, c.d);
  }
  auto* k8 = reinterpret_cast<uint8_t*>(kh.data());
  auto* v8 = reinterpret_cast<uint8_t*>(vh.data());
  for (int64_t i = 0; i < cache_elems && !q8; ++i) {
    if (f8) {
      k8[i] = ToFp8Bits(kf[i]);
      kf[i] = FromFp8Bits(k8[i]);
      v8[i] = ToFp8Bits(vf[i]);
      vf[i] = FromFp8Bits(v8[i]);
    } else {
      kh[i] = ToBf16Bits(kf[i]);
      kf[i] = FromBf16Bits(kh[i]);
      vh[i] = ToBf16Bits(vf[i]);
      vf[i] = FromBf16Bits(vh[i]);
    }
  }
  const int64_t q_stride = (c.h + 2 * c.hkv) * c.d;
  // Scaled so that softmax is neither flat nor one-hot. int8: the group
  // factors raise the keys' RMS about 2.7 times, so q shrinks as much (the
  // kernels' error grows with the scores' magnitude).
  const float q_range = q8 ? 0.75f : 2.0f;
  const std::vector<float> q = Random(t * q_stride, rng, -q_range, q_range);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  std::vector<float> ref(t * c.h * c.d);
  KvCacheView ref_kv;  // the CPU kernel over the same (bf16-exact) values
  ref_kv.num_blocks = num_blocks;
  ref_kv.block_size = bs;
  ref_kv.num_kv_heads = c.hkv;
  ref_kv.head_dim = c.d;
  ref_kv.dtype = kvcache::KvDtype::kF32;
  ref_kv.k = {reinterpret_cast<std::byte*>(kf.data())};
  ref_kv.v = {reinterpret_cast<std::byte*>(vf.data())};
  PagedAttention(AttentionParams{c.h, c.hkv, c.d, scale, c.window}, b, q.data(),
                 nullptr, q_stride, ref_kv, 0, ref.data());

  const AttnShape shape{c.h,        c.hkv,    c.d,   bs,
                        max_blocks, c.window, scale, c.elem};
  const int sms = c.num_sms > 0 ? c.num_sms : NumSms();
  const AttnPlan plan =
      PlanAttention(shape, b.seq_starts.data(), b.context_lens.data(),
                    b.num_seqs(), sms, c.tuning);
  Dev<AttnWorkItem> small(plan.small.size()), tiles(plan.tiles.size());
  small.Up(plan.small);
  tiles.Up(plan.tiles);
  Dev<float> dq(q.size()), scratch(AttnScratchFloats(shape, sms, c.tuning));
  Dev<uint16_t> dk(kh.size()), dv(vh.size()), out(ref.size());
  Dev<int32_t> tables(b.block_tables.size());
  dq.Up(q);
  dk.Up(kh);
  dv.Up(vh);
  tables.Up(b.block_tables);
  out.Poison();
  scratch.Poison();
  CK(PagedAttention(shape, plan, small.get(), tiles.get(), dq.get(), q_stride,
                    dk.get(), dv.get(), tables.get(), scratch.get(),
                    reinterpret_cast<bf16*>(out.get()), nullptr));
  CK(cudaDeviceSynchronize());
  const std::vector<float> got = ToFloat(out.Down(ref.size()));
  // Relative error per head, or per 32 values with int8 pages, whose groups'
  // magnitudes span three decades (an error in a small group would vanish
  // against the head's norm).
  const int seg = q8 ? kQ8Group : c.d;
  int bad = 0;
  for (int64_t i = 0; i < t * c.h * c.d / seg && bad < 5; ++i) {
    const int64_t off = i * seg;
    const double err = RelErr(got.data() + off, ref.data() + off, seg);
    if (!(err < 1e-2)) {
      ADD_FAILURE() << "token " << off / (c.h * c.d) << " head "
                    << off / c.d % c.h << " values " << off % c.d << ".."
                    << off % c.d + seg - 1 << " rel err " << err
                    << " (splits small " << plan.small_splits << ", tiles "
                    << plan.tile_splits << ")";
      ++bad;
    }
  }
}

TEST(CudaKernels, PagedAttentionDecodeManyShapes) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  for (int d : {64, 128}) {
    for (int ratio : {1, 4, 8}) {
      for (int bs : {16, 32}) {
        std::vector<std::pair<int, int>> seqs;
        for (int ctx : {1, 2, 17, 64, 65, 333, 1024}) seqs.push_back({1, ctx});
        seqs.push_back({1, 500 + static_cast<int>(rng() % 4000)});
        RunAttention({8 * ratio, 8, d, bs, 0, seqs, 0}, rng);
        RunAttention({4 * ratio, 4, d, bs, 0, seqs, 1000}, rng);  // splits
      }
    }
  }
}

// The tensor-core decode kernel (AttnTuning::mma_decode) on the decode
// shapes, with split-K, a sliding window, and prefill tiles (FMA kernel) in
// the same batch.
TEST(CudaKernels, PagedAttentionMmaDecode) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  AttnTuning mma;
  mma.mma_decode = true;
  for (int d : {64, 128}) {
    for (int ratio : {1, 4, 8}) {
      std::vector<std::pair<int, int>> seqs;
      for (int ctx : {1, 2, 17, 64, 65, 333, 1024}) seqs.push_back({1, ctx});
      seqs.push_back({1, 500 + static_cast<int>(rng() % 4000)});
      RunAttention({8 * ratio, 8, d, 16, 0, seqs, 0, mma}, rng);
      RunAttention({4 * ratio, 4, d, 32, 0, seqs, 1000, mma}, rng);  // splits
    }
  }
  RunAttention({32, 8, 128, 16, 100, {{1, 3000}, {70, 300}, {1, 40}}, 0, mma},
               rng);
  RunAttention({8, 8, 64, 24, 0, {{2, 900}, {1, 8191}, {37, 37}}, 132, mma},
               rng);
}

// Under the SIMT emulator (a CPU running every thread) the longest cases
// shrink by kLong so that the sanitizer stage of CI stays in minutes; the
// code paths (split-K, tiles, windows) are the same.
#if defined(KVSERVE_CUDA_EMU)
constexpr int kLong = 4;
#else
constexpr int kLong = 1;
#endif

TEST(CudaKernels, PagedAttentionLongContexts) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (int ctx : {4096, 8191, 32768 / kLong}) {
    RunAttention({32, 8, 128, 16, 0, {{1, ctx}}, 0}, rng);
    RunAttention({64, 8, 128, 16, 0, {{1, ctx}, {1, ctx / 3}}, 0}, rng);
  }
  // Long cached prefix with a new prefill chunk (tiles with split-K).
  RunAttention({32, 8, 128, 16, 0, {{40, 20000 / kLong}}, 0}, rng);
  RunAttention({8, 8, 64, 32, 0, {{100, 12000 / kLong}, {1, 30000 / kLong}}, 0},
               rng);
  // A block size that is not a power of two (the kernel's divide-free
  // block-table lookup).
  RunAttention({32, 8, 128, 24, 0, {{1, 5000}, {30, 700}}, 0}, rng);
  // Split-K tunings the device benchmark sweeps: up to 8 blocks per SM and
  // 64-key splits (over 32 splits: the combine's lanes loop over them).
  for (const AttnTuning t : {AttnTuning{8, 64}, AttnTuning{2, 128}}) {
    RunAttention({64, 8, 128, 16, 0, {{1, 8191}, {1, 333}}, 132, t}, rng);
    RunAttention({8, 2, 64, 16, 0, {{1, 5000}, {20, 3000}}, 132, t}, rng);
  }
}

TEST(CudaKernels, PagedAttentionPrefillAndMixed) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  for (int d : {64, 128}) {
    for (int ratio : {1, 3, 4, 8}) {
      for (int bs : {16, 32}) {
        // Fresh prompts, prompts after a cached prefix, and decode tokens in
        // one batch.
        const std::vector<std::pair<int, int>> seqs = {
            {1, 1}, {37, 37}, {130, 130}, {5, 900}, {1, 77}, {64, 64 + 31}};
        RunAttention({2 * ratio, 2, d, bs, 0, seqs, 0}, rng);
        RunAttention({2 * ratio, 2, d, bs, 0, seqs, 500}, rng);
      }
    }
  }
}

TEST(CudaKernels, PagedAttentionSlidingWindow) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const std::vector<std::pair<int, int>> seqs = {
      {1, 5000 / kLong}, {70, 300}, {1, 40}, {200, 4200 / kLong}};
  for (int window : {32, 100, 4096 / kLong}) {
    RunAttention({32, 8, 128, 16, window, seqs, 0}, rng);
    RunAttention({8, 8, 64, 32, window, seqs, 1000}, rng);
  }
}

// fp8 e4m3 caches: the kernels convert each tile to bf16 exactly, so the
// reference over the same fp8 values holds to the bf16 tolerance. Decode
// (FMA and tensor-core kernels, split-K), prefill tiles, a window.
TEST(CudaKernels, PagedAttentionFp8Kv) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  constexpr KvElem kFp8 = KvElem::kFp8E4M3;
  AttnTuning mma;
  mma.mma_decode = true;
  for (int d : {64, 128}) {
    for (int ratio : {1, 3, 8}) {
      std::vector<std::pair<int, int>> seqs;
      for (int ctx : {1, 17, 65, 1024}) seqs.push_back({1, ctx});
      seqs.push_back({37, 37});
      seqs.push_back({5, 900});
      RunAttention({4 * ratio, 4, d, 16, 0, seqs, 0, {}, kFp8}, rng);
      RunAttention({4 * ratio, 4, d, 32, 0, seqs, 1000, {}, kFp8}, rng);
      RunAttention({4 * ratio, 4, d, 16, 0, seqs, 1000, mma, kFp8}, rng);
    }
  }
  RunAttention(
      {32, 8, 128, 24, 100, {{1, 3000 / kLong}, {70, 300}}, 0, {}, kFp8}, rng);
}

// int8 caches (q8_0 pages, a scale per 32 values; each group's magnitude
// drawn from 0.01 to 10, so a wrong scale gives an O(1) error): the
// reference reads the same values the tile loader makes (q * scale rounded
// to bf16), so the bf16 tolerance holds, per 32 output values. Decode (FMA and
// tensor-core kernels, split-K), prefill tiles, a block size that is not a
// power of two, a window.
TEST(CudaKernels, PagedAttentionInt8Kv) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  constexpr KvElem kQ8 = KvElem::kInt8;
  AttnTuning mma;
  mma.mma_decode = true;
  for (int d : {64, 128}) {
    for (int ratio : {1, 3, 8}) {
      std::vector<std::pair<int, int>> seqs;
      for (int ctx : {1, 17, 65, 1024}) seqs.emplace_back(1, ctx);
      seqs.emplace_back(37, 37);
      seqs.emplace_back(5, 900);
      RunAttention({4 * ratio, 4, d, 16, 0, seqs, 0, {}, kQ8}, rng);
      RunAttention({4 * ratio, 4, d, 32, 0, seqs, 1000, {}, kQ8}, rng);
      RunAttention({4 * ratio, 4, d, 16, 0, seqs, 1000, mma, kQ8}, rng);
    }
  }
  RunAttention(
      {32, 8, 128, 24, 100, {{1, 3000 / kLong}, {70, 300}}, 0, {}, kQ8}, rng);
  RunAttention({8, 1, 64, 4, 0, {{1, 700}, {20, 90}}, 0, mma, kQ8}, rng);
}

TEST(CudaKernels, CopyKvBlocksCopiesEveryPlane) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  const int planes = 6, blocks = 20;
  const int64_t block_elems = 16 * 8 * 64;
  const int64_t plane_elems = blocks * block_elems;
  std::vector<uint16_t> data(planes * plane_elems);
  for (uint16_t& h : data) h = static_cast<uint16_t>(rng());
  const std::vector<int32_t> pairs = {3, 7, 0, 19, 12, 1};
  Dev<uint16_t> d(data.size());
  Dev<int32_t> dp(pairs.size());
  d.Up(data);
  dp.Up(pairs);
  CK(CopyKvBlocks(d.get(), plane_elems * 2, planes, block_elems * 2, dp.get(),
                  3, nullptr));
  std::vector<uint16_t> want = data;
  for (int p = 0; p < planes; ++p) {
    for (int i = 0; i < 3; ++i) {
      std::copy_n(
          data.begin() + p * plane_elems + pairs[2 * i] * block_elems,
          block_elems,
          want.begin() + p * plane_elems + pairs[2 * i + 1] * block_elems);
    }
  }
  EXPECT_EQ(d.Down(data.size()), want);
}

// Swap staging: gathering blocks {5, 0, 17} lays each block's planes out
// contiguously (a host swap slot); scattering that into {2, 9, 11} writes
// exactly those blocks of every plane.
TEST(CudaKernels, StageKvBlocksGathersAndScatters) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  const int planes = 4, blocks = 20, n = 3;
  const int64_t block_elems = 16 * 2 * 64;
  const int64_t plane_elems = blocks * block_elems;
  std::vector<uint16_t> data(planes * plane_elems);
  for (uint16_t& h : data) h = static_cast<uint16_t>(rng());
  const std::vector<int32_t> src = {5, 0, 17}, dst = {2, 9, 11};
  Dev<uint16_t> d(data.size()), st(n * planes * block_elems);
  Dev<int32_t> ds(n), dd(n);
  d.Up(data);
  ds.Up(src);
  dd.Up(dst);
  st.Poison();
  uint16_t* base = d.get();
  uint16_t* stage = st.get();
  CK(StageKvBlocks(base, plane_elems * 2, planes, block_elems * 2, ds.get(), n,
                   stage, /*to_staging=*/true, nullptr));
  std::vector<uint16_t> want_stage(n * planes * block_elems);
  std::vector<uint16_t> want = data;
  for (int i = 0; i < n; ++i) {
    for (int p = 0; p < planes; ++p) {
      const auto from = data.begin() + p * plane_elems + src[i] * block_elems;
      std::copy_n(from, block_elems,
                  want_stage.begin() + (i * planes + p) * block_elems);
      std::copy_n(from, block_elems,
                  want.begin() + p * plane_elems + dst[i] * block_elems);
    }
  }
  EXPECT_EQ(st.Down(want_stage.size()), want_stage);
  CK(StageKvBlocks(base, plane_elems * 2, planes, block_elems * 2, dd.get(), n,
                   stage, /*to_staging=*/false, nullptr));
  EXPECT_EQ(d.Down(data.size()), want);
}

// The device argmax picks what std::max_element picks on the host: the
// first maximum. Rows: random (vocabularies that are not a multiple of the
// block, one smaller than the block), a maximum tied at several indices
// (two of them in one thread's share), the maximum in the last element, and
// all -inf (index 0).
TEST(CudaKernels, ArgmaxRowsMatchesMaxElement) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (int64_t vocab : {int64_t{49152}, int64_t{128256 + 7}, int64_t{100}}) {
    const int64_t rows = 6;
    std::vector<float> logits = Random(rows * vocab, rng, -30.0f, 30.0f);
    float* tied = logits.data() + 1 * vocab;
    for (int64_t j : {vocab - 1, vocab / 2, int64_t{7}, int64_t{7 + 256}}) {
      if (j < vocab) tied[j] = 99.0f;
    }
    logits[3 * vocab - 1] = 1e30f;
    std::fill_n(logits.data() + 3 * vocab, vocab, -INFINITY);
    float* low = logits.data() + 4 * vocab;  // every value equal
    std::fill_n(low, vocab, -5.0f);
    Dev<float> d(logits.size());
    Dev<int32_t> out(rows);
    d.Up(logits);
    out.Poison();
    CK(ArgmaxRows(d.get(), rows, vocab, out.get(), nullptr));
    const std::vector<int32_t> got = out.Down(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits.data() + r * vocab;
      EXPECT_EQ(got[r], std::max_element(row, row + vocab) - row)
          << "vocab " << vocab << " row " << r;
    }
    EXPECT_EQ(got[1], std::min<int64_t>(7, vocab - 1));
    EXPECT_EQ(got[2], vocab - 1);
    EXPECT_EQ(got[3], 0);
    EXPECT_EQ(got[4], 0);
  }
}

}  // namespace
}  // namespace kvserve::models::cuda

#else  // !KVSERVE_CUDA

TEST(CudaKernels, NotBuilt) {
  GTEST_SKIP() << "built without CUDA (KVSERVE_CUDA=OFF)";
}

#endif  // KVSERVE_CUDA
