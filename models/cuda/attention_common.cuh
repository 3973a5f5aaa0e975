// Pieces shared by the paged attention kernels (attention.cu: the fp32 FMA
// kernel for decode and prefill; attention_mma.cu: the tensor-core decode
// kernel): constants, the register-staged K/V tile loader, the online
// softmax of one tile, the causal / sliding-window mask, and the split-K
// partial layout read by the combine kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "models/cuda/fast_div.h"
#include "models/cuda/fp8.cuh"
#include "models/cuda/int8_kv.cuh"
#include "models/cuda/kernels.h"

namespace kvserve::models::cuda::attn {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 64;
constexpr int kSmallRows = 8;
constexpr int kTileRows = 64;
constexpr float kLog2e = 1.4426950408889634f;

// One thread block's share of a work item: keys [begin, end) of split
// `split`, and where its partial rows go (row r of the block is partial row
// part_row0 + r: the layout CombineKernel reads).
struct BlockKeys {
  int begin = 0, end = 0;
  int64_t part_row0 = 0;

  __device__ BlockKeys(const AttnShape& s, const AttnWorkItem& it,
                       int partition, int num_splits, int rows) {
    const int key_end = it.pos0 + it.num_tokens;  // exclusive
    const int key_begin =
        s.sliding_window > 0 ? max(0, it.pos0 - s.sliding_window + 1) : 0;
    begin = key_begin + static_cast<int>(blockIdx.x) * partition;
    end = min(key_end, begin + partition);
    part_row0 =
        ((static_cast<int64_t>(blockIdx.z) * s.num_kv_heads + blockIdx.y) *
             num_splits +
         blockIdx.x) *
        rows;
  }

  // For a split past the item's keys: marks its `rows` partial rows empty
  // (m = -inf, l = 0; part_ml is the (m, l) area) and returns true, the
  // block having nothing else to do.
  __device__ bool Empty(float* part_ml, bool partial, int rows) const {
    if (begin < end) return false;
    const int r = static_cast<int>(threadIdx.x);
    if (partial && r < rows) {
      part_ml[(part_row0 + r) * 2] = -INFINITY;
      part_ml[(part_row0 + r) * 2 + 1] = 0.0f;
    }
    return true;
  }
};

// Element d of query row r of the item (head kvh * group + r % group of
// token it.token + r / group), times qscale; 0 for rows past nrows.
template <int D>
__device__ inline float ScaledQuery(const float* __restrict__ q,
                                    int64_t q_stride, const AttnWorkItem& it,
                                    int kvh, int group, int nrows, float qscale,
                                    int r, int d) {
  if (r >= nrows) return 0.0f;
  const int64_t tok = it.token + r / group;
  const int h = kvh * group + r % group;
  return q[tok * q_stride + h * D + d] * qscale;
}

// Whether row r (token pos0 + r / group) sees key t: causal, and within the
// sliding window when there is one.
__device__ inline bool KeyVisible(const AttnShape& s, const AttnWorkItem& it,
                                  int group, int r, int t) {
  const int pos = it.pos0 + r / group;
  return t <= pos && (s.sliding_window <= 0 || t > pos - s.sliding_window);
}

// Eight int8 values and the fp16 bits of their group's scale.
struct Q8Chunk {
  uint2 q;
  uint32_t scale;
};

// Eight KV values as loaded from the cache: 16 bytes of bf16, 8 of fp8,
// 8 of int8 and their scale.
template <typename KvT>
struct KvChunk {
  using Raw = uint4;
};
template <>
struct KvChunk<fp8> {
  using Raw = uint2;
};
template <>
struct KvChunk<int8_t> {
  using Raw = Q8Chunk;
};

// Eight cached values as eight bf16.
__device__ inline uint4 ToBf16x8(const uint4& raw) { return raw; }
__device__ inline uint4 ToBf16x8(const uint2& raw) {
  const uint32_t w[2] = {raw.x, raw.y};
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t pair = w[i / 2] >> (16 * (i % 2));
    o[i] = Fp8ToBf16Bits(pair & 0xFFu) |
           (Fp8ToBf16Bits((pair >> 8) & 0xFFu) << 16);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}
// int8 values times their fp16 scale: the product is exact in fp32 (8 + 11
// significant bits), then rounded to bf16, which adds at most 2^-9 of the
// value (<= amax / 512 absolute) to the quantization error of at most
// scale / 2 = amax / 254: the int8 pages dequantize about 1.5 times less
// precisely than the CPU's int8 KV, which reads the fp32 products.
__device__ inline uint4 ToBf16x8(const Q8Chunk& raw) {
  const float d = F16BitsToF32(raw.scale);
  const uint32_t w[2] = {raw.q.x, raw.q.y};
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t pair = w[i / 2] >> (16 * (i % 2));
    const float lo = static_cast<float>(static_cast<int8_t>(pair & 0xFFu)) * d;
    const float hi =
        static_cast<float>(static_cast<int8_t>((pair >> 8) & 0xFFu)) * d;
    o[i] = F32ToBf16Bits(lo) | (F32ToBf16Bits(hi) << 16);
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

// K and V of one 64-key tile, staged in registers (loads of 8 values,
// issued a tile ahead of use) and then stored to shared memory rows of `pad`
// bf16, converted from the cache's element type KvT (bf16, fp8, or int8
// with a scale per 32 values: int8_kv.cuh's block layout).
template <int D, typename KvT = bf16>
struct KvTileLoader {
  using Raw = typename KvChunk<KvT>::Raw;
  static constexpr int kCh = D / 8;  // 8-value chunks per key
  static constexpr int kLpt = kTileKeys * kCh / kThreads;
  static_assert(kLpt * kThreads == kTileKeys * kCh);
  Raw kr[kLpt], vr[kLpt];

  // Keys t0 .. min(t0 + 64, end) - 1 of the sequence whose block table is
  // `table`, KV head kvh; keys past `end` load as zeros.
  __device__ void Load(const KvT* __restrict__ kc, const KvT* __restrict__ vc,
                       const int32_t* __restrict__ table, FastDiv block_div,
                       int kvh, int num_kv_heads, int t0, int end) {
    const int nk = min(kTileKeys, end - t0);
    [[maybe_unused]] const int64_t slot_stride =
        static_cast<int64_t>(num_kv_heads) * D;
#pragma unroll
    for (int i = 0; i < kLpt; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kThreads;
      const int key = c / kCh, ch = c % kCh;
      if (key < nk) {
        const int t = t0 + key;
        const int blk = block_div.Div(t);  // t / block_size, divide-free
        const int row = t - blk * block_div.d;
        if constexpr (std::is_same_v<KvT, int8_t>) {
          const Q8Layout lay(block_div.d, num_kv_heads, D);
          const int i8 = kvh * D + ch * 8;
          kr[i] = LoadQ8(kc, lay, table[blk], row, i8);
          vr[i] = LoadQ8(vc, lay, table[blk], row, i8);
        } else {
          const int64_t slot =
              static_cast<int64_t>(table[blk]) * block_div.d + row;
          const int64_t off = slot * slot_stride + kvh * D + ch * 8;
          kr[i] = __ldg(reinterpret_cast<const Raw*>(kc + off));
          vr[i] = __ldg(reinterpret_cast<const Raw*>(vc + off));
        }
      } else {
        kr[i] = Raw{};
        vr[i] = Raw{};
      }
    }
  }

  // The chunk of values i .. i + 7 (of the slot's H*D) of row `row` of
  // block `block`, with its group's scale.
  static __device__ Q8Chunk LoadQ8(const int8_t* __restrict__ c,
                                   const Q8Layout& lay, int64_t block, int row,
                                   int i) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(c);
    Q8Chunk r;
    r.q =
        __ldg(reinterpret_cast<const uint2*>(bytes + lay.Value(block, row, i)));
    r.scale = __ldg(reinterpret_cast<const unsigned short*>(
        bytes + lay.Scale(block, row, i)));
    return r;
  }

  __device__ void Store(bf16* k_s, bf16* v_s, int pad) const {
#pragma unroll
    for (int i = 0; i < kLpt; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kThreads;
      const int key = c / kCh, ch = c % kCh;
      *reinterpret_cast<uint4*>(k_s + key * pad + ch * 8) = ToBf16x8(kr[i]);
      *reinterpret_cast<uint4*>(v_s + key * pad + ch * 8) = ToBf16x8(vr[i]);
    }
  }
};

// Online softmax of one tile, one warp per row r < nrows: the row's 64
// scores (base-2 logits) in p_s become exp2(s - m_new), written back to p_s
// or, with `pb`, as bf16 to pb (row stride pbstride); m_s, l_s hold the
// running max and sum, a_s the factor that rescales earlier partial sums.
__device__ inline void OnlineSoftmaxTile(float* p_s, int pstride, float* m_s,
                                         float* l_s, float* a_s, int nrows,
                                         bf16* pb = nullptr, int pbstride = 0) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int r = warp; r < nrows; r += kWarps) {
    float* pr = p_s + r * pstride;
    const float v0 = pr[lane], v1 = pr[lane + 32];
    float mx = fmaxf(v0, v1);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    const float m_old = m_s[r];
    const float m_new = fmaxf(m_old, mx);
    float e0 = 0.0f, e1 = 0.0f, alpha = 1.0f;
    if (m_new != -INFINITY) {
      e0 = exp2f(v0 - m_new);
      e1 = exp2f(v1 - m_new);
      alpha = exp2f(m_old - m_new);
    }
    if (pb != nullptr) {
      pb[r * pbstride + lane] = __float2bfloat16(e0);
      pb[r * pbstride + lane + 32] = __float2bfloat16(e1);
    } else {
      pr[lane] = e0;
      pr[lane + 32] = e1;
    }
    float sum = e0 + e1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    if (lane == 0) {
      l_s[r] = l_s[r] * alpha + sum;
      m_s[r] = m_new;
      a_s[r] = alpha;
    }
  }
}

// The tensor-core decode kernel (attention_mma.cu) for `num_items` small
// items (rows <= 8), writing out or, with splits > 1, the partials that
// CombineKernel<D, kSmallRows> merges. D is 64 or 128.
template <int D, typename KvT>
cudaError_t LaunchMmaDecode(const AttnShape& s, int num_items, int splits,
                            int partition, const AttnWorkItem* items,
                            const float* q, int64_t q_stride, const KvT* kc,
                            const KvT* vc, const int32_t* tables,
                            float* scratch, bf16* out, cudaStream_t stream);

}  // namespace kvserve::models::cuda::attn
