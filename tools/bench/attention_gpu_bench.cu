// Standalone decode-attention check and benchmark: needs only nvcc and the
// CUDA runtime (no abseil, gtest or oneDNN), so it builds on a bare GPU
// image:
//   nvcc -O3 -std=c++17 -arch=sm_90 -I. tools/bench/attention_gpu_bench.cu \
//     models/cuda/attention.cu models/cuda/attention_mma.cu \
//     models/cuda/elementwise.cu -o attention_bench
// 1. checks PagedAttention against a CPU fp32 reference (decode and prefill,
//    GQA 1/4/8, D 64/128, split-K forced and not, NaN-poisoned output), with
//    bf16, fp8 e4m3 and int8 (q8_0) KV pages;
// 2. measures copy bandwidth and decode attention GB/s (Llama-3-8B and 70B
//    head shapes, D=128, block 16, batch 1..256, context 512..32K; bf16
//    pages on both kernels, fp8 and int8 pages on the FMA one);
// 3. sweeps the split-K tuning (AttnTuning: blocks per SM x minimum keys per
//    split, FMA or tensor-core decode kernel) at batch 1..32, context 4K
//    and 32K, as fractions of copy bandwidth, to choose the defaults from
//    measurement. Both decode kernels are checked first (1.) and timed in
//    (2.); the tensor-core one only where its check passed.
// Exit status 1 on a wrong result. tools/device_bench.sh runs it first.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "models/cuda/int8_kv.cuh"
#include "models/cuda/kernels.h"
#include "tools/bench/gpu_timing.h"

using namespace kvserve::models::cuda;

#define CK GPU_BENCH_CHECK

namespace {

float Bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)));
  if (!v.empty()) {
    CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  return p;
}

// Multiplies each 32-value group of x (one int8 scale's values) by its own
// factor 10^u, u uniform in [-2, 1]: neighbouring scales differ by up to
// 1000x, so a value dequantized with another group's scale is off by O(1).
void SpreadGroupMagnitudes(std::vector<uint16_t>* x, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 1.0f);
  for (size_t g = 0; g < x->size() / kQ8Group; ++g) {
    const float f = std::pow(10.0f, u(rng));
    for (int j = 0; j < kQ8Group; ++j) {
      uint16_t& e = (*x)[g * kQ8Group + j];
      e = ToBf16(Bf16(e) * f);
    }
  }
}

// int8 pages of `blocks` blocks of bs slots of hkv * d bf16 values x
// (slot-major), encoded as reshape-and-cache does (int8_kv.cuh); x becomes
// what the tile loader reads: q * scale rounded to bf16.
std::vector<uint8_t> PackQ8(std::vector<uint16_t>* x, int blocks, int bs,
                            int hkv, int d) {
  const Q8Layout lay(bs, hkv, d);
  std::vector<uint8_t> out(blocks * lay.block_bytes);
  const int64_t groups = static_cast<int64_t>(blocks) * bs * hkv * d / 32;
  for (int64_t g = 0; g < groups; ++g) {
    uint16_t* xg = x->data() + g * 32;
    const int64_t slot = g * 32 / lay.row_values;
    const int i = static_cast<int>(g * 32 % lay.row_values);
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(Bf16(xg[j])));
    const float inv = Q8InvScale(amax);
    const uint16_t sbits = F32ToF16Bits(amax / 127.0f);
    const float scale = F16BitsToF32(sbits);
    std::memcpy(&out[lay.Scale(slot / bs, slot % bs, i)], &sbits, 2);
    for (int j = 0; j < 32; ++j) {
      const int8_t q = Q8Quantize(Bf16(xg[j]), inv);
      out[lay.Value(slot / bs, slot % bs, i + j)] = static_cast<uint8_t>(q);
      xg[j] = ToBf16(static_cast<float>(q) * scale);
    }
  }
  return out;
}

const char* ElemName(KvElem e) {
  return e == KvElem::kBf16 ? "bf16" : (e == KvElem::kInt8 ? "int8" : "fp8");
}

// One check: seqs of (new tokens, context); returns the worst relative
// error of an output row (of 32 values of one with int8 pages). `elem`: the
// pages' element type (the reference reads the same values).
double Check(int h, int hkv, int d, int bs, int sms,
             const std::vector<std::pair<int, int>>& seqs,
             const AttnTuning& tuning, KvElem elem, std::mt19937& rng) {
  const int g = h / hkv;
  int mb = 0, total = 0;
  for (auto [n, c] : seqs) {
    mb = std::max(mb, (c + bs - 1) / bs);
    total += (c + bs - 1) / bs;
  }
  std::vector<int32_t> pool(total);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> starts = {0}, lens, tables;
  int next = 0;
  for (auto [n, c] : seqs) {
    const int nb = (c + bs - 1) / bs;
    for (int j = 0; j < mb; ++j) tables.push_back(j < nb ? pool[next + j] : 0);
    next += nb;
    starts.push_back(starts.back() + n);
    lens.push_back(c);
  }
  const int t = starts.back();
  const int64_t slot = static_cast<int64_t>(hkv) * d;
  const int64_t elems = static_cast<int64_t>(total) * bs * slot;
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint16_t> k(elems), v(elems);
  for (auto& x : k) x = ToBf16(u(rng));
  for (auto& x : v) x = ToBf16(u(rng));
  if (elem == KvElem::kInt8) {
    SpreadGroupMagnitudes(&k, rng);
    SpreadGroupMagnitudes(&v, rng);
  }
  // fp8 and int8 pages: the bytes uploaded, and k / v rounded to them.
  std::vector<uint8_t> k8, v8;
  if (elem == KvElem::kInt8) {
    k8 = PackQ8(&k, total, bs, hkv, d);
    v8 = PackQ8(&v, total, bs, hkv, d);
  } else if (elem == KvElem::kFp8E4M3) {
    k8.resize(elems);
    v8.resize(elems);
    for (int64_t i = 0; i < elems; ++i) {
      const fp8 a(Bf16(k[i])), b(Bf16(v[i]));
      k8[i] = a.__x;
      v8[i] = b.__x;
      k[i] = ToBf16(static_cast<float>(a));
      v[i] = ToBf16(static_cast<float>(b));
    }
  }
  const int64_t qs = static_cast<int64_t>(h + 2 * hkv) * d;
  std::vector<float> q(t * qs);
  // int8: the group factors raise the keys' RMS about 2.7 times, so q
  // shrinks as much (the scores keep bf16's spread).
  const float q_range = elem == KvElem::kInt8 ? 0.75f : 2.0f;
  for (auto& x : q) x = q_range * u(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const AttnShape shape{h, hkv, d, bs, mb, 0, scale, elem};
  const AttnPlan plan = PlanAttention(shape, starts.data(), lens.data(),
                                      seqs.size(), sms, tuning);
  AttnWorkItem* ds = Upload(plan.small);
  AttnWorkItem* dt = Upload(plan.tiles);
  float* dq = Upload(q);
  void* dk = k8.empty() ? static_cast<void*>(Upload(k)) : Upload(k8);
  void* dv = v8.empty() ? static_cast<void*>(Upload(v)) : Upload(v8);
  int32_t* dtab = Upload(tables);
  float* scratch = nullptr;
  CK(cudaMalloc(&scratch, AttnScratchFloats(shape, sms, tuning) * 4));
  uint16_t* dout = nullptr;
  CK(cudaMalloc(&dout, t * h * d * 2));
  CK(cudaMemset(dout, 0xff, t * h * d * 2));  // NaN
  CK(PagedAttention(shape, plan, ds, dt, dq, qs, dk, dv, dtab, scratch,
                    reinterpret_cast<bf16*>(dout), nullptr));
  CK(cudaDeviceSynchronize());
  std::vector<uint16_t> out(t * h * d);
  CK(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost));
  double worst = 0;
  std::vector<double> sc, o(d);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int i = starts[s]; i < starts[s + 1]; ++i) {
      const int pos = lens[s] - (starts[s + 1] - i);
      for (int hh = 0; hh < h; ++hh) {
        const int kvh = hh / g;
        sc.assign(pos + 1, 0.0);
        double mx = -1e300;
        for (int p = 0; p <= pos; ++p) {
          const int64_t sl =
              static_cast<int64_t>(tables[s * mb + p / bs]) * bs + p % bs;
          double acc = 0;
          for (int e = 0; e < d; ++e) {
            acc += q[i * qs + hh * d + e] * Bf16(k[sl * slot + kvh * d + e]);
          }
          sc[p] = acc * scale;
          mx = std::max(mx, sc[p]);
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        std::fill(o.begin(), o.end(), 0.0);
        for (int p = 0; p <= pos; ++p) {
          const int64_t sl =
              static_cast<int64_t>(tables[s * mb + p / bs]) * bs + p % bs;
          for (int e = 0; e < d; ++e) {
            o[e] += sc[p] / sum * Bf16(v[sl * slot + kvh * d + e]);
          }
        }
        // Per row, or per 32 values with int8 pages, whose groups'
        // magnitudes span three decades.
        const int seg = elem == KvElem::kInt8 ? kQ8Group : d;
        for (int e0 = 0; e0 < d; e0 += seg) {
          double num = 0, den = 0;
          for (int e = e0; e < e0 + seg; ++e) {
            const double got =
                Bf16(out[(static_cast<int64_t>(i) * h + hh) * d + e]);
            if (!std::isfinite(got)) return INFINITY;
            num += (got - o[e]) * (got - o[e]);
            den += o[e] * o[e];
          }
          worst = std::max(worst, std::sqrt(num / den));
        }
      }
    }
  }
  for (void* p : {(void*)ds, (void*)dt, (void*)dq, (void*)dk, (void*)dv,
                  (void*)dtab, (void*)scratch, (void*)dout}) {
    CK(cudaFree(p));
  }
  return worst;
}

constexpr int kD = 128, kBs = 16, kHkv = 8;

struct Pool {
  void *k, *v;
  int64_t blocks;
  KvElem elem = KvElem::kBf16;
};

// K + V of every context token, q in (fp32) and out (bf16).
double DecodeBytes(int h, int batch, int ctx, KvElem elem = KvElem::kBf16) {
  return 2.0 * batch * ctx / kBs * KvBlockBytes(elem, kBs, kHkv, kD) +
         batch * h * kD * 6.0;
}

// Median seconds of one decode attention call at batch x context with
// `tuning`; each call reads other random blocks of the pool.
double TimeDecode(int h, int batch, int ctx, const AttnTuning& tuning,
                  const Pool& kv, int sms, std::mt19937& rng) {
  const int mb = (ctx + kBs - 1) / kBs;
  std::vector<int32_t> starts(batch + 1), lens(batch, ctx);
  std::iota(starts.begin(), starts.end(), 0);
  const AttnShape shape{h, kHkv, kD, kBs, mb, 0, 0.088f, kv.elem};
  const AttnPlan plan =
      PlanAttention(shape, starts.data(), lens.data(), batch, sms, tuning);
  constexpr int kSets = 13;
  std::vector<int32_t> tables(static_cast<size_t>(kSets) * batch * mb);
  for (auto& x : tables) x = static_cast<int32_t>(rng() % kv.blocks);
  int32_t* dt = Upload(tables);
  AttnWorkItem* ds = Upload(plan.small);
  AttnWorkItem* dti = Upload(plan.tiles);
  const int64_t qs = (h + 2 * kHkv) * kD;
  float* q = nullptr;
  CK(cudaMalloc(&q, batch * qs * 4));
  CK(cudaMemset(q, 0x3c, batch * qs * 4));
  float* scratch = nullptr;
  CK(cudaMalloc(&scratch, AttnScratchFloats(shape, sms, tuning) * 4));
  bf16* o = nullptr;
  CK(cudaMalloc(&o, batch * h * kD * 2));
  const double t =
      kvserve::gpu_bench::MedianSecondsPerCall(3, 10, 5, [&](int i) {
        CK(PagedAttention(shape, plan, ds, dti, q, qs, kv.k, kv.v,
                          dt + static_cast<int64_t>(i % kSets) * batch * mb,
                          scratch, o, nullptr));
      });
  for (void* p :
       {(void*)dt, (void*)ds, (void*)dti, (void*)q, (void*)scratch, (void*)o}) {
    CK(cudaFree(p));
  }
  return t;
}

}  // namespace

int main() {
  if (!kvserve::gpu_bench::HaveDeviceOrExplain("attention_gpu_bench")) {
    return 0;
  }
  int sms = 1;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(1);
  bool ok = true;
  struct C {
    int h, hkv, d, bs, sms;
    std::vector<std::pair<int, int>> seqs;
  };
  const std::vector<C> checks = {
      {32, 8, 128, 16, sms, {{1, 1}, {1, 100}, {1, 4097}}},
      {32, 8, 128, 16, 1000, {{1, 1}, {1, 100}, {1, 4097}}},
      {64, 8, 128, 16, sms, {{1, 9000}, {1, 33}}},
      {8, 8, 64, 32, sms, {{1, 300}, {70, 70}, {5, 1000}}},
      {16, 2, 64, 16, 500, {{130, 400}, {1, 2000}}},
      {32, 32, 128, 32, sms, {{3, 3}, {1, 65}}}};
  AttnTuning mma;
  mma.mma_decode = true;
  bool mma_ok = true;
  for (const C& c : checks) {
    for (const KvElem elem : {KvElem::kBf16, KvElem::kFp8E4M3, KvElem::kInt8}) {
      for (const AttnTuning& tuning : {AttnTuning{}, mma}) {
        const double err =
            Check(c.h, c.hkv, c.d, c.bs, c.sms, c.seqs, tuning, elem, rng);
        const bool pass = err < 1e-2;
        (tuning.mma_decode ? mma_ok : ok) &= pass;
        std::printf(
            "check H=%d Hkv=%d D=%d B=%d sms=%d %s %s: max rel err %.2e "
            "%s\n",
            c.h, c.hkv, c.d, c.bs, c.sms, tuning.mma_decode ? "mma" : "fma",
            ElemName(elem), err, pass ? "ok" : "FAIL");
      }
    }
  }
  // The tensor-core decode kernel is timed only where it computes the
  // right function (its failure fails the run too).
  ok &= mma_ok;
  const double copy_bw = kvserve::gpu_bench::CopyBandwidth(size_t{4} << 30);
  std::printf(
      "\ncopy bandwidth %.0f GB/s\n\n| heads | batch | context | fma us | "
      "GB/s | of copy | mma us | of copy | fp8 fma us | fp8 GB/s | fp8 of "
      "copy | int8 fma us | int8 GB/s | int8 of copy |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
      copy_bw / 1e9);
  const int64_t pool = 256LL * 32768 / kBs + 1024;
  const int64_t elems = pool * kBs * kHkv * kD;
  bf16 *kc, *vc;
  CK(cudaMalloc(&kc, elems * 2));
  CK(cudaMalloc(&vc, elems * 2));
  CK(FillRandomBf16(kc, elems, 1, 1.0f, nullptr));
  CK(FillRandomBf16(vc, elems, 2, 1.0f, nullptr));
  const Pool kv{kc, vc, pool};
  // The same bytes read as fp8 pages (twice the blocks; values irrelevant).
  const Pool kv8{kc, vc, 2 * pool, KvElem::kFp8E4M3};
  // ... and as int8 pages (32/17 of the blocks; timing only: the scales are
  // random bits).
  const Pool kvq{kc, vc, 2 * pool * 16 / 17, KvElem::kInt8};
  for (int h : {32, 64}) {
    for (int batch : {1, 8, 64, 256}) {
      for (int ctx : {512, 4096, 32768}) {
        const double t = TimeDecode(h, batch, ctx, {}, kv, sms, rng);
        const double tm =
            mma_ok ? TimeDecode(h, batch, ctx, mma, kv, sms, rng) : INFINITY;
        const double t8 = TimeDecode(h, batch, ctx, {}, kv8, sms, rng);
        const double tq = TimeDecode(h, batch, ctx, {}, kvq, sms, rng);
        const double by = DecodeBytes(h, batch, ctx);
        const double by8 = DecodeBytes(h, batch, ctx, KvElem::kFp8E4M3);
        const double byq = DecodeBytes(h, batch, ctx, KvElem::kInt8);
        std::printf(
            "| %d/%d | %d | %d | %.1f | %.0f | %.2f | %.1f | %.2f | %.1f | "
            "%.0f | %.2f | %.1f | %.0f | %.2f |\n",
            h, kHkv, batch, ctx, t * 1e6, by / t / 1e9, by / t / copy_bw,
            tm * 1e6, by / tm / copy_bw, t8 * 1e6, by8 / t8 / 1e9,
            by8 / t8 / copy_bw, tq * 1e6, byq / tq / 1e9, byq / tq / copy_bw);
      }
    }
  }
  // Split-K tuning (AttnTuning) where the batch does not fill the chip: the
  // fraction of copy bandwidth per (blocks per SM, min keys per split); the
  // best of each row should become the default.
  const AttnTuning grid[] = {{2, 64, false}, {2, 128, false}, {2, 256, false},
                             {4, 64, false}, {4, 128, false}, {4, 256, false},
                             {8, 64, false}, {8, 128, false}, {8, 256, false},
                             {2, 64, true},  {2, 128, true},  {2, 256, true},
                             {4, 64, true},  {4, 128, true},  {4, 256, true},
                             {8, 64, true},  {8, 128, true},  {8, 256, true}};
  std::printf(
      "\nsplit-K tuning sweep (fraction of copy bandwidth)\n\n"
      "| heads | batch | context |");
  for (const AttnTuning& g : grid) {
    std::printf(" %s %d/%d |", g.mma_decode ? "mma" : "fma", g.blocks_per_sm,
                g.min_keys_per_split);
  }
  std::printf("\n|---|---|---|");
  for (size_t i = 0; i < std::size(grid); ++i) std::printf("---|");
  std::printf("\n");
  for (int h : {32, 64}) {
    for (int batch : {1, 8, 32}) {
      for (int ctx : {4096, 32768}) {
        std::printf("| %d/%d | %d | %d |", h, kHkv, batch, ctx);
        for (const AttnTuning& g : grid) {
          if (g.mma_decode && !mma_ok) {
            std::printf(" - |");
            continue;
          }
          const double t = TimeDecode(h, batch, ctx, g, kv, sms, rng);
          std::printf(" %.2f |", DecodeBytes(h, batch, ctx) / t / copy_bw);
        }
        std::printf("\n");
      }
    }
  }
  CK(cudaFree(kc));
  CK(cudaFree(vc));
  return ok ? 0 : 1;
}
