// Paged grouped-query attention on the GPU, one kernel for both phases.
//
// A thread block takes one work item (a run of consecutive query tokens of
// one sequence), one KV head and one split of the item's key range, so each
// KV head is read once for its whole group of query heads (rows = tokens x
// group). Keys stream through shared memory in tiles of 64: K and V tiles
// are loaded with 16-byte loads (the next tile's loads are issued before the
// current tile is computed), then
//   scores   thread (key, row group): q . k for its rows, from shared memory
//   softmax  one warp per row: online (running max / sum, base-2 exponents)
//   P.V      thread (d pair, row group): acc[row][d] += p[row][key] * v
// Two instantiations per head dim: 8 rows (decode: split-K along the context
// like flash-decoding, with a combine kernel) and 64 rows (prefill tiles).
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "models/cuda/attention_common.cuh"
#include "models/cuda/fast_div.h"
#include "models/cuda/kernels.h"
#include "models/cuda/launch.h"

namespace kvserve::models::cuda {
namespace {

using attn::kLog2e;
using attn::kSmallRows;
using attn::kThreads;
using attn::kTileKeys;
using attn::kTileRows;

template <int D, int ROWS>
struct Smem {
  static constexpr int kPad = D + 8;  // bf16 per K/V row: no bank conflicts
  static constexpr int kQ = ROWS * D * 4;
  static constexpr int kKV = kTileKeys * kPad * 2;
  static constexpr int kPStride = kTileKeys + 1;
  static constexpr int kP = ROWS * kPStride * 4;
  static constexpr int kBytes = kQ + 2 * kKV + kP + 3 * ROWS * 4;
};

__device__ inline void Unpack8(const uint4& raw, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

template <int D, int ROWS, typename KvT>
__global__ void __launch_bounds__(kThreads)
    PagedAttnKernel(AttnShape s, FastDiv block_div,
                    const AttnWorkItem* __restrict__ items, int partition,
                    int num_splits, const float* __restrict__ q,
                    int64_t q_stride, const KvT* __restrict__ kc,
                    const KvT* __restrict__ vc,
                    const int32_t* __restrict__ tables,
                    float* __restrict__ part, bf16* __restrict__ out) {
  using S = Smem<D, ROWS>;
  constexpr int kCh = D / 8;                       // 16-byte chunks per row
  constexpr int kQkGroups = kThreads / kTileKeys;  // row groups for scores
  constexpr int kQkRpt = ROWS / kQkGroups;
  constexpr int kPvThreads = D / 2;                 // one d pair each
  constexpr int kPvGroups = kThreads / kPvThreads;  // row groups for P.V
  constexpr int kPvRpt = ROWS / kPvGroups;
  static_assert(kPvRpt * kPvGroups == ROWS && kQkRpt * kQkGroups == ROWS);

  KV_DYNAMIC_SMEM(unsigned char, smem);
  float* q_s = reinterpret_cast<float*>(smem);
  bf16* k_s = reinterpret_cast<bf16*>(smem + S::kQ);
  bf16* v_s = reinterpret_cast<bf16*>(smem + S::kQ + S::kKV);
  float* p_s = reinterpret_cast<float*>(smem + S::kQ + 2 * S::kKV);
  float* m_s = p_s + ROWS * S::kPStride;
  float* l_s = m_s + ROWS;
  float* a_s = l_s + ROWS;

  const AttnWorkItem it = items[blockIdx.z];
  const int kvh = blockIdx.y;
  const int group = s.num_heads / s.num_kv_heads;
  const int nrows = it.num_tokens * group;
  const int tid = threadIdx.x;
  const attn::BlockKeys keys(s, it, partition, num_splits, ROWS);
  const int s_begin = keys.begin, s_end = keys.end;
  const bool partial = num_splits > 1;
  const int64_t total_rows =
      static_cast<int64_t>(gridDim.x) * gridDim.y * gridDim.z * ROWS;
  const int64_t part_row0 = keys.part_row0;
  float* part_ml = part + total_rows * D;

  if (keys.Empty(part_ml, partial, ROWS)) return;

  const float qscale = s.scale * kLog2e;
  for (int i = tid; i < ROWS * D; i += kThreads) {
    q_s[i] = attn::ScaledQuery<D>(q, q_stride, it, kvh, group, nrows, qscale,
                                  i / D, i % D);
  }
  if (tid < ROWS) {
    m_s[tid] = -INFINITY;
    l_s[tid] = 0.0f;
    a_s[tid] = 1.0f;
  }

  const int32_t* table =
      tables + static_cast<int64_t>(it.seq) * s.max_blocks_per_seq;
  attn::KvTileLoader<D, KvT> tile;
  float acc[kPvRpt][2];
#pragma unroll
  for (int j = 0; j < kPvRpt; ++j) acc[j][0] = acc[j][1] = 0.0f;
  const int kk = tid % kTileKeys, qg = tid / kTileKeys;
  const int dp = tid % kPvThreads, rg = tid / kPvThreads;

  tile.Load(kc, vc, table, block_div, kvh, s.num_kv_heads, s_begin, s_end);
  for (int t0 = s_begin; t0 < s_end; t0 += kTileKeys) {
    __syncthreads();  // previous tile's P.V is done with k_s, v_s, p_s
    tile.Store(k_s, v_s, S::kPad);
    __syncthreads();
    if (t0 + kTileKeys < s_end) {  // in flight meanwhile
      tile.Load(kc, vc, table, block_div, kvh, s.num_kv_heads, t0 + kTileKeys,
                s_end);
    }

    // Scores: key kk against rows qg, qg + kQkGroups, ...
    float sc[kQkRpt];
#pragma unroll
    for (int j = 0; j < kQkRpt; ++j) sc[j] = 0.0f;
    const bf16* krow = k_s + kk * S::kPad;
#pragma unroll 2
    for (int ch = 0; ch < kCh; ++ch) {
      float kf[8];
      Unpack8(*reinterpret_cast<const uint4*>(krow + ch * 8), kf);
#pragma unroll
      for (int j = 0; j < kQkRpt; ++j) {
        const int r = qg + kQkGroups * j;
        if (r < nrows) {  // warp-uniform
          const float4 a =
              *reinterpret_cast<const float4*>(q_s + r * D + ch * 8);
          const float4 b =
              *reinterpret_cast<const float4*>(q_s + r * D + ch * 8 + 4);
          sc[j] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] +
                   b.x * kf[4] + b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
        }
      }
    }
    const int t = t0 + kk;
#pragma unroll
    for (int j = 0; j < kQkRpt; ++j) {
      const int r = qg + kQkGroups * j;
      float v = -INFINITY;
      if (r < nrows && t < s_end && attn::KeyVisible(s, it, group, r, t)) {
        v = sc[j];
      }
      p_s[r * S::kPStride + kk] = v;
    }
    __syncthreads();

    attn::OnlineSoftmaxTile(p_s, S::kPStride, m_s, l_s, a_s, nrows);
    __syncthreads();

    // P.V: d pair dp of rows rg, rg + kPvGroups, ...
#pragma unroll
    for (int j = 0; j < kPvRpt; ++j) {
      const int r = rg + kPvGroups * j;
      if (r < nrows) {
        const float a = a_s[r];
        acc[j][0] *= a;
        acc[j][1] *= a;
      }
    }
#pragma unroll 8
    for (int key = 0; key < kTileKeys; ++key) {
      const float2 v =
          __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(
              v_s + key * S::kPad + 2 * dp));
#pragma unroll
      for (int j = 0; j < kPvRpt; ++j) {
        const int r = rg + kPvGroups * j;
        if (r < nrows) {
          const float p = p_s[r * S::kPStride + key];
          acc[j][0] += p * v.x;
          acc[j][1] += p * v.y;
        }
      }
    }
  }

#pragma unroll
  for (int j = 0; j < kPvRpt; ++j) {
    const int r = rg + kPvGroups * j;
    if (r >= nrows) continue;
    if (!partial) {
      const float l = l_s[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const int64_t tok = it.token + r / group;
      const int h = kvh * group + r % group;
      *reinterpret_cast<__nv_bfloat162*>(
          out + tok * (static_cast<int64_t>(s.num_heads) * D) + h * D +
          2 * dp) = __floats2bfloat162_rn(acc[j][0] * inv, acc[j][1] * inv);
    } else {
      *reinterpret_cast<float2*>(part + (part_row0 + r) * D + 2 * dp) =
          make_float2(acc[j][0], acc[j][1]);
      if (dp == 0) {
        part_ml[(part_row0 + r) * 2] = m_s[r];
        part_ml[(part_row0 + r) * 2 + 1] = l_s[r];
      }
    }
  }
}

// Merges the splits of each (item, KV head, row): out = sum_s 2^(m_s - M)
// acc_s / sum_s 2^(m_s - M) l_s; splits with no keys (m = -inf) are
// skipped. One warp per row (block z picks kCombineWarps rows): lanes take
// splits for the max and the denominator, then D / 32 consecutive output
// elements each, reading every split's partial row once, coalesced.
constexpr int kCombineWarps = 4;

__device__ inline float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;
}
__device__ inline float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int D, int ROWS>
__global__ void __launch_bounds__(kCombineWarps * 32)
    CombineKernel(AttnShape s, const AttnWorkItem* __restrict__ items,
                  int num_items, int num_splits, const float* __restrict__ part,
                  bf16* __restrict__ out) {
  constexpr int kPerLane = D / 32;
  const AttnWorkItem it = items[blockIdx.y];
  const int kvh = blockIdx.x;
  const int group = s.num_heads / s.num_kv_heads;
  const int nrows = it.num_tokens * group;
  const int lane = threadIdx.x % 32;
  const int r = blockIdx.z * kCombineWarps + threadIdx.x / 32;
  if (r >= nrows) return;  // whole warps: no barrier follows
  const int64_t total_rows =
      static_cast<int64_t>(num_items) * s.num_kv_heads * num_splits * ROWS;
  const float* ml = part + total_rows * D;
  const int64_t row0 =
      (static_cast<int64_t>(blockIdx.y) * s.num_kv_heads + kvh) * num_splits *
          ROWS +
      r;  // split sp's row: row0 + sp * ROWS
  float mx = -INFINITY;
  for (int sp = lane; sp < num_splits; sp += 32) {
    mx = fmaxf(mx, ml[(row0 + static_cast<int64_t>(sp) * ROWS) * 2]);
  }
  mx = WarpMax(mx);
  float l = 0.0f;
  for (int sp = lane; sp < num_splits; sp += 32) {
    const int64_t row = row0 + static_cast<int64_t>(sp) * ROWS;
    const float m = ml[row * 2];
    if (m != -INFINITY) l += exp2f(m - mx) * ml[row * 2 + 1];
  }
  l = WarpSum(l);
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  float acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) acc[j] = 0.0f;
  for (int sp = 0; sp < num_splits; ++sp) {
    const int64_t row = row0 + static_cast<int64_t>(sp) * ROWS;
    const float m = ml[row * 2];  // the same address for the whole warp
    if (m == -INFINITY) continue;
    const float w = exp2f(m - mx);
    const float* src = part + row * D + lane * kPerLane;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) acc[j] += w * src[j];
  }
  const int64_t tok = it.token + r / group;
  const int h = kvh * group + r % group;
  bf16* dst = out + tok * (static_cast<int64_t>(s.num_heads) * D) + h * D +
              lane * kPerLane;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) dst[j] = __float2bfloat16(acc[j] * inv);
}

template <int D, int ROWS, typename KvT>
cudaError_t Launch(const AttnShape& s, int num_items, int splits, int partition,
                   const AttnWorkItem* items, const float* q, int64_t q_stride,
                   const KvT* kc, const KvT* vc, const int32_t* tables,
                   float* scratch, bf16* out, bool mma, cudaStream_t stream) {
  if (num_items == 0) return cudaSuccess;
  if (ROWS == kSmallRows && mma) {
    const cudaError_t err = attn::LaunchMmaDecode<D, KvT>(
        s, num_items, splits, partition, items, q, q_stride, kc, vc, tables,
        scratch, out, stream);
    if (err != cudaSuccess) return err;
  } else {
    constexpr int kBytes = Smem<D, ROWS>::kBytes;
    static const cudaError_t attr = cudaFuncSetAttribute(
        PagedAttnKernel<D, ROWS, KvT>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes);
    if (attr != cudaSuccess) return attr;
    const dim3 grid(splits, s.num_kv_heads, num_items);
    KV_LAUNCH(grid, kThreads, kBytes, stream, PagedAttnKernel<D, ROWS, KvT>)
    (s, FastDiv(s.block_size), items, partition, splits, q, q_stride, kc, vc,
     tables, scratch, out);
  }
  if (splits > 1) {
    const dim3 combine_grid(s.num_kv_heads, num_items,
                            (ROWS + kCombineWarps - 1) / kCombineWarps);
    KV_LAUNCH(combine_grid, kCombineWarps * 32, 0, stream,
              CombineKernel<D, ROWS>)
    (s, items, num_items, splits, scratch, out);
  }
  return cudaGetLastError();
}

// Splits the key range so that the launch has about tuning.blocks_per_sm
// blocks per multiprocessor, each split at least tuning.min_keys_per_split
// keys (a multiple of the key tile). Guarantees items * kv_heads * splits <
// 2 * blocks_per_sm * SMs whenever splits > 1 (the scratch bound).
void ChooseSplits(const AttnShape& s, const std::vector<AttnWorkItem>& items,
                  int num_sms, const AttnTuning& tuning, int32_t* splits,
                  int32_t* partition) {
  *splits = 1;
  *partition = 1 << 30;
  if (items.empty()) return;
  int64_t max_len = 1;
  for (const AttnWorkItem& it : items) {
    const int begin =
        s.sliding_window > 0 ? std::max(0, it.pos0 - s.sliding_window + 1) : 0;
    max_len = std::max<int64_t>(max_len, it.pos0 + it.num_tokens - begin);
  }
  const int64_t base = static_cast<int64_t>(items.size()) * s.num_kv_heads;
  const int64_t target =
      static_cast<int64_t>(std::max(tuning.blocks_per_sm, 1)) * num_sms;
  const int64_t min_keys = std::max(tuning.min_keys_per_split, 1);
  if (base >= target) return;
  int64_t want = (target + base - 1) / base;
  want = std::min<int64_t>(want, (max_len + min_keys - 1) / min_keys);
  if (want <= 1) return;
  int64_t part = (max_len + want - 1) / want;
  part = (part + kTileKeys - 1) / kTileKeys * kTileKeys;
  *partition = static_cast<int32_t>(part);
  *splits = static_cast<int32_t>((max_len + part - 1) / part);
  if (*splits <= 1) {
    *splits = 1;
    *partition = 1 << 30;
  }
}

// Both kinds of items (small decode groups, then tiles) for D = head_dim.
template <typename KvT>
cudaError_t LaunchAll(const AttnShape& shape, const AttnPlan& plan,
                      const AttnWorkItem* items_small,
                      const AttnWorkItem* items_tiles, const float* q,
                      int64_t q_stride, const KvT* kc, const KvT* vc,
                      const int32_t* block_tables, float* scratch, bf16* out,
                      cudaStream_t stream) {
  const int ns = static_cast<int>(plan.small.size());
  const int nt = static_cast<int>(plan.tiles.size());
  cudaError_t err;
  if (shape.head_dim == 128) {
    err = Launch<128, kSmallRows>(
        shape, ns, plan.small_splits, plan.small_partition, items_small, q,
        q_stride, kc, vc, block_tables, scratch, out, plan.mma_decode, stream);
    if (err != cudaSuccess) return err;
    return Launch<128, kTileRows>(
        shape, nt, plan.tile_splits, plan.tile_partition, items_tiles, q,
        q_stride, kc, vc, block_tables, scratch, out, false, stream);
  }
  err = Launch<64, kSmallRows>(
      shape, ns, plan.small_splits, plan.small_partition, items_small, q,
      q_stride, kc, vc, block_tables, scratch, out, plan.mma_decode, stream);
  if (err != cudaSuccess) return err;
  return Launch<64, kTileRows>(shape, nt, plan.tile_splits, plan.tile_partition,
                               items_tiles, q, q_stride, kc, vc, block_tables,
                               scratch, out, false, stream);
}

}  // namespace

int64_t AttnScratchFloats(const AttnShape& shape, int num_sms,
                          const AttnTuning& tuning) {
  const int64_t max_blocks =
      2LL * std::max(tuning.blocks_per_sm, 1) * std::max(num_sms, 1);
  return max_blocks * kTileRows * (shape.head_dim + 2);
}

AttnPlan PlanAttention(const AttnShape& shape, const int32_t* seq_starts,
                       const int32_t* context_lens, int32_t num_seqs,
                       int num_sms, const AttnTuning& tuning) {
  AttnPlan plan;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int per_tile = std::max(1, kTileRows / group);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t n = seq_starts[s + 1] - seq_starts[s];
    const int32_t pos0 = context_lens[s] - n;
    if (n * group <= kSmallRows) {
      plan.small.push_back({s, seq_starts[s], n, pos0});
      continue;
    }
    for (int32_t i = 0; i < n; i += per_tile) {
      plan.tiles.push_back(
          {s, seq_starts[s] + i, std::min(per_tile, n - i), pos0 + i});
    }
  }
  plan.mma_decode = tuning.mma_decode;
  ChooseSplits(shape, plan.small, num_sms, tuning, &plan.small_splits,
               &plan.small_partition);
  ChooseSplits(shape, plan.tiles, num_sms, tuning, &plan.tile_splits,
               &plan.tile_partition);
  return plan;
}

cudaError_t PagedAttention(const AttnShape& shape, const AttnPlan& plan,
                           const AttnWorkItem* items_small,
                           const AttnWorkItem* items_tiles, const float* q,
                           int64_t q_stride, const void* k_cache,
                           const void* v_cache, const int32_t* block_tables,
                           float* scratch, bf16* out, cudaStream_t stream) {
  const int group = shape.num_heads / shape.num_kv_heads;
  if (shape.num_kv_heads <= 0 ||
      group * shape.num_kv_heads != shape.num_heads || group > kTileRows ||
      (shape.head_dim != 64 && shape.head_dim != 128)) {
    return cudaErrorInvalidValue;
  }
  if (shape.kv_elem == KvElem::kInt8) {
    // Every chunk load is 8-byte aligned, every block 16-byte aligned.
    if (static_cast<int64_t>(shape.block_size) * shape.num_kv_heads *
            shape.head_dim % 256 !=
        0) {
      return cudaErrorInvalidValue;
    }
    return LaunchAll(shape, plan, items_small, items_tiles, q, q_stride,
                     static_cast<const int8_t*>(k_cache),
                     static_cast<const int8_t*>(v_cache), block_tables, scratch,
                     out, stream);
  }
  if (shape.kv_elem == KvElem::kFp8E4M3) {
    return LaunchAll(shape, plan, items_small, items_tiles, q, q_stride,
                     static_cast<const fp8*>(k_cache),
                     static_cast<const fp8*>(v_cache), block_tables, scratch,
                     out, stream);
  }
  return LaunchAll(shape, plan, items_small, items_tiles, q, q_stride,
                   static_cast<const bf16*>(k_cache),
                   static_cast<const bf16*>(v_cache), block_tables, scratch,
                   out, stream);
}

}  // namespace kvserve::models::cuda
