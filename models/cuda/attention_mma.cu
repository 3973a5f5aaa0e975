// Tensor-core decode attention (AttnTuning::mma_decode): the same blocks,
// tiles, online softmax and split-K partials as the FMA kernel of
// attention.cu for items of at most 8 query rows (one KV head's group), but
// both products on mma.sync m16n8k16 (mma.cuh):
//   scores   warp w: S^T (keys 16w..16w+15 x 8 rows) = K (16 x D) Q^T (D x 8)
//   P.V      warp w: O^T (its D/4 dims x 8 rows) += V^T (D/4 x 64) P^T (64 x 8)
// q and the tile's probabilities are rounded to bf16 for the products
// (accumulation stays fp32). Its fragments' layout is checked only by the
// SIMT emulator here: a device run must pass the kernel tests with
// mma_decode before it becomes the default.
#include <cuda_bf16.h>

#include <cmath>

#include "models/cuda/attention_common.cuh"
#include "models/cuda/launch.h"
#include "models/cuda/mma.cuh"

namespace kvserve::models::cuda::attn {
namespace {

template <int D>
struct MmaSmem {
  static constexpr int kPad = D + 8;  // bf16 per q / K / V row
  static constexpr int kQ = kSmallRows * kPad * 2;
  static constexpr int kKV = kTileKeys * kPad * 2;
  static constexpr int kPStride = kTileKeys + 1;  // fp32 scores
  static constexpr int kP = kSmallRows * kPStride * 4;
  static constexpr int kPbPad = kTileKeys + 8;  // bf16 probabilities
  static constexpr int kPb = kSmallRows * kPbPad * 2;
  static constexpr int kBytes = kQ + 2 * kKV + kP + kPb + 3 * kSmallRows * 4;
  static_assert(kQ % 16 == 0 && kKV % 16 == 0 && kP % 16 == 0 && kPb % 16 == 0);
};

__device__ inline uint32_t Load32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Scores of this warp's 16 keys against the 8 query rows: sc[i] is key
// 16 * warp + g + 8 * (i / 2), row 2 * t + i % 2.
template <int D, int kPad>
__device__ inline void TileScores(const bf16* k_s, const bf16* q_s, int warp,
                                  int g, int t, float sc[4]) {
  const bf16* k0 = k_s + (16 * warp + g) * kPad + 2 * t;
  const bf16* k1 = k0 + 8 * kPad;
  const bf16* qr = q_s + g * kPad + 2 * t;
#pragma unroll
  for (int kk = 0; kk < D; kk += 16) {
    const uint32_t a[4] = {Load32(k0 + kk), Load32(k1 + kk),
                           Load32(k0 + kk + 8), Load32(k1 + kk + 8)};
    const uint32_t b[2] = {Load32(qr + kk), Load32(qr + kk + 8)};
    MmaBf16M16N8K16(sc, a, b, sc);
  }
}

// acc[m] += V^T P^T for this warp's m-tiles (dims 16 * (warp * kM + m) ..):
// acc[m][i] is dim 16 * (warp * kM + m) + g + 8 * (i / 2), row 2t + i % 2.
template <int kM, int kPad, int kPbPad>
__device__ inline void TilePV(const bf16* v_s, const bf16* pb_s, int warp,
                              int g, int t, float acc[kM][4]) {
#pragma unroll
  for (int kk = 0; kk < kTileKeys; kk += 16) {
    const bf16* pr = pb_s + g * kPbPad + kk + 2 * t;
    const uint32_t b[2] = {Load32(pr), Load32(pr + 8)};
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      const bf16* v = v_s + (kk + 2 * t) * kPad + 16 * (warp * kM + m) + g;
      const uint32_t a[4] = {PackBf16(v[0], v[kPad]),
                             PackBf16(v[8], v[kPad + 8]),
                             PackBf16(v[8 * kPad], v[9 * kPad]),
                             PackBf16(v[8 * kPad + 8], v[9 * kPad + 8])};
      MmaBf16M16N8K16(acc[m], a, b, acc[m]);
    }
  }
}

template <int D, typename KvT>
__global__ void __launch_bounds__(kThreads)
    MmaDecodeKernel(AttnShape s, FastDiv block_div,
                    const AttnWorkItem* __restrict__ items, int partition,
                    int num_splits, const float* __restrict__ q,
                    int64_t q_stride, const KvT* __restrict__ kc,
                    const KvT* __restrict__ vc,
                    const int32_t* __restrict__ tables,
                    float* __restrict__ part, bf16* __restrict__ out) {
  using S = MmaSmem<D>;
  constexpr int R = kSmallRows;
  constexpr int kM = D / 16 / kWarps;  // P.V m-tiles per warp
  static_assert(kM >= 1 && kM * 16 * kWarps == D);
  KV_DYNAMIC_SMEM(unsigned char, smem);
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = reinterpret_cast<bf16*>(smem + S::kQ);
  bf16* v_s = reinterpret_cast<bf16*>(smem + S::kQ + S::kKV);
  float* p_s = reinterpret_cast<float*>(smem + S::kQ + 2 * S::kKV);
  bf16* pb_s = reinterpret_cast<bf16*>(smem + S::kQ + 2 * S::kKV + S::kP);
  float* m_s =
      reinterpret_cast<float*>(smem + S::kQ + 2 * S::kKV + S::kP + S::kPb);
  float* l_s = m_s + R;
  float* a_s = l_s + R;

  const AttnWorkItem it = items[blockIdx.z];
  const int kvh = blockIdx.y;
  const int group = s.num_heads / s.num_kv_heads;
  const int nrows = it.num_tokens * group;
  const int tid = threadIdx.x, warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
  const BlockKeys keys(s, it, partition, num_splits, R);
  const bool partial = num_splits > 1;
  const int64_t total_rows =
      static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z * R;
  float* part_ml = part + total_rows * D;
  if (keys.Empty(part_ml, partial, R)) return;

  // q as base-2 logits in bf16; rows past nrows, and their probabilities,
  // stay zero.
  const float qscale = s.scale * kLog2e;
  for (int i = tid; i < R * D; i += kThreads) {
    const int r = i / D, d = i % D;
    q_s[r * S::kPad + d] = __float2bfloat16(
        ScaledQuery<D>(q, q_stride, it, kvh, group, nrows, qscale, r, d));
  }
  for (int i = tid; i < R * S::kPbPad; i += kThreads) {
    pb_s[i] = __float2bfloat16(0.0f);
  }
  if (tid < R) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    a_s[tid] = 1.0f;
  }

  const int32_t* table =
      tables + static_cast<int64_t>(it.seq) * s.max_blocks_per_seq;
  KvTileLoader<D, KvT> tile;
  float acc[kM][4];
#pragma unroll
  for (int m = 0; m < kM; ++m)
    acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0;
  tile.Load(kc, vc, table, block_div, kvh, s.num_kv_heads, keys.begin,
            keys.end);
  for (int t0 = keys.begin; t0 < keys.end; t0 += kTileKeys) {
    __syncthreads();  // the previous tile's P.V is done with v_s, pb_s
    tile.Store(k_s, v_s, S::kPad);
    __syncthreads();
    if (t0 + kTileKeys < keys.end) {
      tile.Load(kc, vc, table, block_div, kvh, s.num_kv_heads, t0 + kTileKeys,
                keys.end);
    }
    float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    TileScores<D, S::kPad>(k_s, q_s, warp, g, t, sc);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = 16 * warp + g + 8 * (i / 2), r = 2 * t + i % 2;
      const int k = t0 + key;
      const bool visible =
          r < nrows && k < keys.end && KeyVisible(s, it, group, r, k);
      p_s[r * S::kPStride + key] = visible ? sc[i] : -INFINITY;
    }
    __syncthreads();
    OnlineSoftmaxTile(p_s, S::kPStride, m_s, l_s, a_s, nrows, pb_s, S::kPbPad);
    __syncthreads();
    const float a0 = a_s[2 * t], a1 = a_s[2 * t + 1];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      acc[m][0] *= a0;
      acc[m][1] *= a1;
      acc[m][2] *= a0;
      acc[m][3] *= a1;
    }
    TilePV<kM, S::kPad, S::kPbPad>(v_s, pb_s, warp, g, t, acc);
  }

#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 2 * t + i % 2;
      if (r >= nrows) continue;
      const int d = 16 * (warp * kM + m) + g + 8 * (i / 2);
      if (partial) {
        part[(keys.part_row0 + r) * D + d] = acc[m][i];
      } else {
        const float l = l_s[r];
        const int64_t tok = it.token + r / group;
        const int h = kvh * group + r % group;
        out[tok * (static_cast<int64_t>(s.num_heads) * D) + h * D + d] =
            __float2bfloat16(l > 0.0f ? acc[m][i] / l : 0.0f);
      }
    }
  }
  if (partial && tid < nrows) {
    part_ml[(keys.part_row0 + tid) * 2] = m_s[tid];
    part_ml[(keys.part_row0 + tid) * 2 + 1] = l_s[tid];
  }
}

}  // namespace

template <int D, typename KvT>
cudaError_t LaunchMmaDecode(const AttnShape& s, int num_items, int splits,
                            int partition, const AttnWorkItem* items,
                            const float* q, int64_t q_stride, const KvT* kc,
                            const KvT* vc, const int32_t* tables,
                            float* scratch, bf16* out, cudaStream_t stream) {
  constexpr int kBytes = MmaSmem<D>::kBytes;
  static_assert(kBytes <= 48 * 1024, "no opt-in needed");
  const dim3 grid(splits, s.num_kv_heads, num_items);
  KV_LAUNCH(grid, kThreads, kBytes, stream, MmaDecodeKernel<D, KvT>)
  (s, FastDiv(s.block_size), items, partition, splits, q, q_stride, kc, vc,
   tables, scratch, out);
  return cudaGetLastError();
}

#define KV_INSTANTIATE_MMA_DECODE(D, KvT)                                 \
  template cudaError_t LaunchMmaDecode<D, KvT>(                           \
      const AttnShape&, int, int, int, const AttnWorkItem*, const float*, \
      int64_t, const KvT*, const KvT*, const int32_t*, float*, bf16*,     \
      cudaStream_t);
KV_INSTANTIATE_MMA_DECODE(64, bf16)
KV_INSTANTIATE_MMA_DECODE(128, bf16)
KV_INSTANTIATE_MMA_DECODE(64, fp8)
KV_INSTANTIATE_MMA_DECODE(128, fp8)
KV_INSTANTIATE_MMA_DECODE(64, int8_t)
KV_INSTANTIATE_MMA_DECODE(128, int8_t)
#undef KV_INSTANTIATE_MMA_DECODE

}  // namespace kvserve::models::cuda::attn
