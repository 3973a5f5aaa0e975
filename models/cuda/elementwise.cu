// Per-token and element-wise kernels of the CUDA Llama forward: fused
// bias + RoPE + reshape-and-cache, RMSNorm with fused residual add, SiLU-mul,
// embedding gather, KV block copy, greedy argmax of logits rows, and
// conversions. Each mirrors the CPU
// reference in models/cpu/ops.cc and models/rope.cc (same formulas, fp32).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "models/cuda/fp8.cuh"
#include "models/cuda/int8_kv.cuh"
#include "models/cuda/kernels.h"
#include "models/cuda/launch.h"

namespace kvserve::models::cuda {
namespace {

constexpr int kThreads = 256;

int GridFor(int64_t n, int threads = kThreads) {
  return static_cast<int>(
      std::min<int64_t>((n + threads - 1) / threads, 65535 * 8));
}

// One KV value in the cache's element type.
__device__ inline bf16 ToKv(float x, const bf16*) {
  return __float2bfloat16(x);
}
__device__ inline fp8 ToKv(float x, const fp8*) {
  fp8 v;
  v.__x = F32ToFp8Bits(x);  // round to nearest even, saturating
  return v;
}

// The K (kv_dim values) and V rows of one token, rotated, in shared memory,
// quantized to int8 pages: one warp per 32-value group (a group never
// crosses a head: head_dim is a multiple of 32), lane j holding value j;
// the group's absmax is a warp reduction.
__device__ inline void StoreQ8Rows(const float* kv_s, int64_t kv_dim,
                                   const Q8Layout& lay, int64_t slot,
                                   int block_size, int8_t* kc, int8_t* vc) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int nwarps = static_cast<int>(blockDim.x) / 32;
  const int64_t block = slot / block_size;
  const int row = static_cast<int>(slot % block_size);
  const int groups = static_cast<int>(kv_dim / kQ8Group);
  for (int g = warp; g < 2 * groups; g += nwarps) {
    const bool is_v = g >= groups;
    const int i = (is_v ? g - groups : g) * kQ8Group + lane;  // h * D + d
    const float x = kv_s[(is_v ? kv_dim : 0) + i];
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    }
    unsigned char* base = reinterpret_cast<unsigned char*>(is_v ? vc : kc);
    base[lay.Value(block, row, i)] =
        static_cast<unsigned char>(Q8Quantize(x, Q8InvScale(amax)));
    if (lane == 0) {
      const uint16_t d = F32ToF16Bits(amax / 127.0f);
      memcpy(base + lay.Scale(block, row, i), &d, 2);
    }
  }
}

// x <- H x for the n = 32 kM values x[lane + 32 j] (j < kM), H the
// orthonormal Walsh-Hadamard matrix in Sylvester's order, by one warp: the
// butterflies of cpu::HadamardRotate in the same order (distances 1, 2, ...
// by shuffles, then 32, 64, ... in registers; sum below, difference above),
// then the same scale, so the results are bit-identical to the CPU's.
template <int kM, typename T>
__device__ inline void WarpHadamard(T* x, int lane, float scale) {
  float v[kM];
#pragma unroll
  for (int j = 0; j < kM; ++j) v[j] = static_cast<float>(x[lane + 32 * j]);
#pragma unroll
  for (int h = 1; h < 32; h *= 2) {
#pragma unroll
    for (int j = 0; j < kM; ++j) {
      const float p = __shfl_xor_sync(0xffffffffu, v[j], h);
      v[j] = (lane & h) != 0 ? p - v[j] : v[j] + p;
    }
  }
#pragma unroll
  for (int hj = 1; hj < kM; hj *= 2) {
#pragma unroll
    for (int j = 0; j < kM; ++j) {
      if ((j & hj) == 0) {
        const float a = v[j], b = v[j + hj];
        v[j] = a + b;
        v[j + hj] = a - b;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kM; ++j) x[lane + 32 * j] = static_cast<T>(v[j] * scale);
}

// WarpHadamard on chunks [0, count) of n values at x, chunk c at x + c * n,
// one warp per chunk, over all the block's warps (n in 64..256).
template <typename T>
__device__ inline void BlockHadamardChunks(T* x, int64_t count, int n,
                                           float scale, int64_t first_warp,
                                           int64_t num_warps) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t c = first_warp; c < count; c += num_warps) {
    T* chunk = x + c * n;
    if (n == 64) {
      WarpHadamard<2>(chunk, lane, scale);
    } else if (n == 128) {
      WarpHadamard<4>(chunk, lane, scale);
    } else {
      WarpHadamard<8>(chunk, lane, scale);
    }
  }
}

// A Hadamard chunk size the warp kernels rotate, dividing `len`; and the
// orthonormal scale of that size (the CPU's expression, so the bits agree).
bool RotationChunkOk(int n, int64_t len) {
  return (n == 64 || n == 128 || n == 256) && len % n == 0;
}
float HadamardScale(int n) { return 1.0f / std::sqrt(static_cast<float>(n)); }

// int8 pages stage the rotated K and V rows in shared memory (after the
// cos/sin tables) and quantize them once complete; bf16 and fp8 write each
// value as it is computed. With rot_k > 0 (int8 only), q and K are then
// Hadamard-rotated in chunks of rot_k values and V in chunks of rot_v
// (kvcache::KvRotationFor) before the quantization.
template <typename KvT>
__global__ void QkvRopeCacheKernel(
    float* qkv, int64_t qkv_stride, int nh, int nkv, int d, bool interleaved,
    const float* __restrict__ inv_freq, const float* __restrict__ bias,
    const int32_t* __restrict__ positions, const int32_t* __restrict__ slots,
    int block_size, int rot_k, int rot_v, float scale_k, float scale_v,
    KvT* __restrict__ kc, KvT* __restrict__ vc) {
  constexpr bool kQ8 = std::is_same_v<KvT, int8_t>;
  KV_DYNAMIC_SMEM(float, cs);  // cos [d/2], sin [d/2]; int8: K, V rows
  const int64_t t = blockIdx.x;
  const int half = d / 2;
  float* row = qkv + t * qkv_stride;
  const double pos = positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    // Angle in double like the CPU tables: large positions lose precision in
    // float.
    const double a = pos * static_cast<double>(inv_freq[i]);
    cs[i] = static_cast<float>(cos(a));
    cs[half + i] = static_cast<float>(sin(a));
  }
  __syncthreads();
  const int64_t q_dim = static_cast<int64_t>(nh) * d;
  const int64_t kv_dim = static_cast<int64_t>(nkv) * d;
  const int64_t slot = slots[t];
  [[maybe_unused]] float* kv_s =
      cs + d;  // int8 only: [kv_dim] K, then [kv_dim] V
  for (int idx = threadIdx.x; idx < (nh + nkv) * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const int ia = interleaved ? 2 * i : i;
    const int ib = interleaved ? 2 * i + 1 : i + half;
    float* v = row + static_cast<int64_t>(h) * d;
    float a = v[ia], b = v[ib];
    if (bias != nullptr) {
      a += bias[static_cast<int64_t>(h) * d + ia];
      b += bias[static_cast<int64_t>(h) * d + ib];
    }
    const float c = cs[i], s = cs[half + i];
    const float ra = a * c - b * s;
    const float rb = a * s + b * c;
    if (h < nh) {
      v[ia] = ra;
      v[ib] = rb;
    } else if constexpr (kQ8) {
      kv_s[static_cast<int64_t>(h - nh) * d + ia] = ra;
      kv_s[static_cast<int64_t>(h - nh) * d + ib] = rb;
    } else {
      KvT* k = kc + slot * kv_dim + static_cast<int64_t>(h - nh) * d;
      k[ia] = ToKv(ra, k);
      k[ib] = ToKv(rb, k);
    }
  }
  for (int64_t idx = threadIdx.x; idx < kv_dim; idx += blockDim.x) {
    float x = row[q_dim + kv_dim + idx];
    if (bias != nullptr) x += bias[q_dim + kv_dim + idx];
    if constexpr (kQ8) {
      kv_s[kv_dim + idx] = x;
    } else {
      vc[slot * kv_dim + idx] = ToKv(x, vc);
    }
  }
  if constexpr (kQ8) {
    __syncthreads();
    if (rot_k > 0) {
      const int64_t warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
      BlockHadamardChunks(row, q_dim / rot_k, rot_k, scale_k, warp, nwarps);
      BlockHadamardChunks(kv_s, kv_dim / rot_k, rot_k, scale_k, warp, nwarps);
      BlockHadamardChunks(kv_s + kv_dim, kv_dim / rot_v, rot_v, scale_v, warp,
                          nwarps);
      __syncthreads();
    }
    StoreQ8Rows(kv_s, kv_dim, Q8Layout(block_size, nkv, d), slot, block_size,
                kc, vc);
  }
}

__device__ inline float BlockSum(float v, float* red) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? red[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

__device__ inline void Store(float* p, float v) { *p = v; }
__device__ inline void Store(bf16* p, float v) { *p = __float2bfloat16(v); }

template <typename Out>
__global__ void AddRmsNormKernel(float* __restrict__ x,
                                 const float* __restrict__ delta,
                                 const float* __restrict__ w, int64_t hidden,
                                 float eps, const int32_t* __restrict__ rows,
                                 Out* __restrict__ out) {
  __shared__ float red[32];
  const int64_t i = blockIdx.x;
  const int64_t src = rows != nullptr ? rows[i] : i;
  float* xr = x + src * hidden;
  const float* dr = delta != nullptr ? delta + src * hidden : nullptr;
  const bool store_back = rows == nullptr && dr != nullptr;
  float ss = 0.0f;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float v = xr[j];
    if (dr != nullptr) v += dr[j];
    if (store_back) xr[j] = v;
    ss += v * v;
  }
  ss = BlockSum(ss, red);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(hidden) + eps);
  Out* o = out + i * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    float v = xr[j];
    if (dr != nullptr && !store_back) v += dr[j];
    Store(o + j, v * scale * w[j]);
  }
}

// (v, i) := the better of (v, i) and (ov, oi): the larger value, the lower
// index on ties; the rule std::max_element follows on the host.
__device__ inline void ArgmaxCombine(float& v, int32_t& i, float ov,
                                     int32_t oi) {
  if (v < ov || (v == ov && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One thread block per row. Each thread scans its strided share in index
// order keeping the first maximum, seeded with its first element (not a
// sentinel) so an all -inf row still yields index 0; threads without an
// element carry (-inf, INT32_MAX), which loses every tie.
__global__ void ArgmaxRowsKernel(const float* __restrict__ logits,
                                 int64_t vocab, int32_t* __restrict__ out) {
  __shared__ float red_v[32];
  __shared__ int32_t red_i[32];
  const float* row = logits + blockIdx.x * vocab;
  float v = -INFINITY;
  int32_t i = INT32_MAX;
  if (threadIdx.x < vocab) {
    v = row[threadIdx.x];
    i = static_cast<int32_t>(threadIdx.x);
  }
  for (int64_t j = threadIdx.x + blockDim.x; j < vocab; j += blockDim.x) {
    if (v < row[j]) {
      v = row[j];
      i = static_cast<int32_t>(j);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgmaxCombine(v, i, __shfl_xor_sync(0xffffffffu, v, o),
                  __shfl_xor_sync(0xffffffffu, i, o));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    red_v[warp] = v;
    red_i[warp] = i;
  }
  __syncthreads();
  if (warp == 0) {
    const bool have = lane < static_cast<int>(blockDim.x / 32);
    v = have ? red_v[lane] : -INFINITY;
    i = have ? red_i[lane] : INT32_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      ArgmaxCombine(v, i, __shfl_xor_sync(0xffffffffu, v, o),
                    __shfl_xor_sync(0xffffffffu, i, o));
    }
    if (lane == 0) out[blockIdx.x] = i;
  }
}

__global__ void SiluMulKernel(const float* __restrict__ gu, int64_t rows,
                              int64_t inter, bf16* __restrict__ out) {
  const int64_t n = rows * inter;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / inter, j = k % inter;
    const float g = gu[i * 2 * inter + j];
    const float u = gu[i * 2 * inter + inter + j];
    out[k] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
  }
}

__global__ void EmbeddingKernel(const bf16* __restrict__ table,
                                const int32_t* __restrict__ ids, int64_t hidden,
                                float* __restrict__ x) {
  const int64_t t = blockIdx.x;
  const bf16* src = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
    x[t * hidden + j] = __bfloat162float(src[j]);
  }
}

__global__ void CopyBlocksKernel(unsigned char* base, int64_t plane_bytes,
                                 int64_t block_bytes,
                                 const int32_t* __restrict__ pairs) {
  const int32_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  unsigned char* plane = base + blockIdx.y * plane_bytes;
  const uint4* s = reinterpret_cast<const uint4*>(plane + src * block_bytes);
  uint4* d = reinterpret_cast<uint4*>(plane + dst * block_bytes);
  const int64_t n = block_bytes / 16;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) d[k] = s[k];
}

__global__ void StageBlocksKernel(unsigned char* base, int64_t plane_bytes,
                                  int64_t block_bytes,
                                  const int32_t* __restrict__ blocks,
                                  unsigned char* staging, bool to_staging) {
  const int64_t i = blockIdx.x, p = blockIdx.y;
  uint4* dev = reinterpret_cast<uint4*>(base + p * plane_bytes +
                                        blocks[i] * block_bytes);
  uint4* st =
      reinterpret_cast<uint4*>(staging + (i * gridDim.y + p) * block_bytes);
  const int64_t n = block_bytes / 16;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    if (to_staging) {
      st[k] = dev[k];
    } else {
      dev[k] = st[k];
    }
  }
}

__global__ void F32ToBf16Kernel(const float* in, int64_t n, bf16* out) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[k] = __float2bfloat16(in[k]);
  }
}

__global__ void Bf16ToF32Kernel(const bf16* in, int64_t n, float* out) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[k] = __bfloat162float(in[k]);
  }
}

__device__ inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void FillRandomKernel(bf16* out, int64_t n, uint64_t seed,
                                 float scale) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = SplitMix64(seed * 0x100000001b3ull + k);
    const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
    out[k] = __float2bfloat16((2.0f * u - 1.0f) * scale);
  }
}

__global__ void FillF32Kernel(float* out, int64_t n, float value) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < n; k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[k] = value;
  }
}

}  // namespace

cudaError_t QkvRopeCache(float* qkv, int64_t num_tokens, int64_t qkv_stride,
                         int num_heads, int num_kv_heads, int head_dim,
                         bool interleaved, const float* inv_freq,
                         const float* bias, const int32_t* positions,
                         const int32_t* slot_mapping, KvElem kv_elem,
                         int block_size, int rot_k, int rot_v, void* k_cache,
                         void* v_cache, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  const size_t smem = head_dim * sizeof(float);
  if (kv_elem == KvElem::kInt8) {
    if (head_dim % kQ8Group != 0 || block_size <= 0 ||
        (rot_k != 0 && (!RotationChunkOk(rot_k, head_dim) ||
                        !RotationChunkOk(rot_v, head_dim)))) {
      return cudaErrorInvalidValue;
    }
    const float scale_k = rot_k > 0 ? HadamardScale(rot_k) : 0.0f;
    const float scale_v = rot_k > 0 ? HadamardScale(rot_v) : 0.0f;
    const size_t q8_smem =
        smem + 2 * static_cast<size_t>(num_kv_heads) * head_dim * sizeof(float);
    if (q8_smem > 48 * 1024) return cudaErrorInvalidValue;
    KV_LAUNCH(num_tokens, 128, q8_smem, stream, QkvRopeCacheKernel<int8_t>)
    (qkv, qkv_stride, num_heads, num_kv_heads, head_dim, interleaved, inv_freq,
     bias, positions, slot_mapping, block_size, rot_k, rot_v, scale_k, scale_v,
     static_cast<int8_t*>(k_cache), static_cast<int8_t*>(v_cache));
  } else if (rot_k != 0) {
    return cudaErrorInvalidValue;  // only int8 pages are stored rotated
  } else if (kv_elem == KvElem::kFp8E4M3) {
    KV_LAUNCH(num_tokens, 128, smem, stream, QkvRopeCacheKernel<fp8>)
    (qkv, qkv_stride, num_heads, num_kv_heads, head_dim, interleaved, inv_freq,
     bias, positions, slot_mapping, block_size, 0, 0, 0.0f, 0.0f,
     static_cast<fp8*>(k_cache), static_cast<fp8*>(v_cache));
  } else {
    KV_LAUNCH(num_tokens, 128, smem, stream, QkvRopeCacheKernel<bf16>)
    (qkv, qkv_stride, num_heads, num_kv_heads, head_dim, interleaved, inv_freq,
     bias, positions, slot_mapping, block_size, 0, 0, 0.0f, 0.0f,
     static_cast<bf16*>(k_cache), static_cast<bf16*>(v_cache));
  }
  return cudaGetLastError();
}

namespace {

__global__ void HadamardRowsKernel(bf16* x, int64_t chunks, int n,
                                   float scale) {
  const int64_t warps_per_block = blockDim.x / 32;
  BlockHadamardChunks(x, chunks, n, scale,
                      blockIdx.x * warps_per_block + threadIdx.x / 32,
                      gridDim.x * warps_per_block);
}

}  // namespace

cudaError_t HadamardRows(bf16* x, int64_t num_rows, int64_t row_len, int n,
                         cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  if (!RotationChunkOk(n, row_len)) return cudaErrorInvalidValue;
  const int64_t chunks = num_rows * row_len / n;
  KV_LAUNCH(GridFor(chunks * 32), kThreads, 0, stream, HadamardRowsKernel)
  (x, chunks, n, HadamardScale(n));
  return cudaGetLastError();
}

cudaError_t AddRmsNorm(float* x, const float* delta, const float* w,
                       int64_t num_rows, int64_t hidden, float eps,
                       const int32_t* rows, bf16* out, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  KV_LAUNCH(num_rows, kThreads, 0, stream, AddRmsNormKernel<bf16>)
  (x, delta, w, hidden, eps, rows, out);
  return cudaGetLastError();
}

cudaError_t AddRmsNorm(float* x, const float* delta, const float* w,
                       int64_t num_rows, int64_t hidden, float eps,
                       const int32_t* rows, float* out, cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  KV_LAUNCH(num_rows, kThreads, 0, stream, AddRmsNormKernel<float>)
  (x, delta, w, hidden, eps, rows, out);
  return cudaGetLastError();
}

cudaError_t SiluMul(const float* gu, int64_t num_rows, int64_t inter, bf16* out,
                    cudaStream_t stream) {
  if (num_rows == 0) return cudaSuccess;
  KV_LAUNCH(GridFor(num_rows * inter), kThreads, 0, stream, SiluMulKernel)
  (gu, num_rows, inter, out);
  return cudaGetLastError();
}

cudaError_t ArgmaxRows(const float* logits, int64_t rows, int64_t vocab,
                       int32_t* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (vocab <= 0 || vocab > INT32_MAX || rows > INT32_MAX) {
    return cudaErrorInvalidValue;
  }
  KV_LAUNCH(static_cast<int>(rows), kThreads, 0, stream, ArgmaxRowsKernel)
  (logits, vocab, out);
  return cudaGetLastError();
}

cudaError_t EmbeddingGather(const bf16* table, const int32_t* ids,
                            int64_t num_tokens, int64_t hidden, float* x,
                            cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  KV_LAUNCH(num_tokens, kThreads, 0, stream, EmbeddingKernel)
  (table, ids, hidden, x);
  return cudaGetLastError();
}

cudaError_t CopyKvBlocks(void* base, int64_t plane_bytes, int num_planes,
                         int64_t block_bytes, const int32_t* pairs,
                         int num_pairs, cudaStream_t stream) {
  if (num_pairs == 0) return cudaSuccess;
  if (block_bytes % 16 != 0) return cudaErrorInvalidValue;
  const dim3 grid(num_pairs, num_planes);
  KV_LAUNCH(grid, kThreads, 0, stream, CopyBlocksKernel)
  (static_cast<unsigned char*>(base), plane_bytes, block_bytes, pairs);
  return cudaGetLastError();
}

cudaError_t StageKvBlocks(void* base, int64_t plane_bytes, int num_planes,
                          int64_t block_bytes, const int32_t* blocks,
                          int num_blocks, void* staging, bool to_staging,
                          cudaStream_t stream) {
  if (num_blocks == 0) return cudaSuccess;
  if (block_bytes % 16 != 0) return cudaErrorInvalidValue;
  const dim3 grid(num_blocks, num_planes);
  KV_LAUNCH(grid, kThreads, 0, stream, StageBlocksKernel)
  (static_cast<unsigned char*>(base), plane_bytes, block_bytes, blocks,
   static_cast<unsigned char*>(staging), to_staging);
  return cudaGetLastError();
}

cudaError_t F32ToBf16(const float* in, int64_t n, bf16* out,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  KV_LAUNCH(GridFor(n), kThreads, 0, stream, F32ToBf16Kernel)(in, n, out);
  return cudaGetLastError();
}

cudaError_t Bf16ToF32(const bf16* in, int64_t n, float* out,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  KV_LAUNCH(GridFor(n), kThreads, 0, stream, Bf16ToF32Kernel)(in, n, out);
  return cudaGetLastError();
}

cudaError_t FillRandomBf16(bf16* out, int64_t n, uint64_t seed, float scale,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  KV_LAUNCH(GridFor(n), kThreads, 0, stream, FillRandomKernel)
  (out, n, seed, scale);
  return cudaGetLastError();
}

cudaError_t FillF32(float* out, int64_t n, float value, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  KV_LAUNCH(GridFor(n), kThreads, 0, stream, FillF32Kernel)(out, n, value);
  return cudaGetLastError();
}

}  // namespace kvserve::models::cuda
