// Host entry points of the CUDA kernels of the Llama forward (models/cuda/
// *.cu). Plain C++ (no abseil, no device code), so that tests, benchmarks
// and the forward call them from .cc files; each launches on `stream` and
// returns the launch's cudaError_t (cudaGetLastError), never synchronizes.
//
// KV cache layout, per layer, K and V separately, in the cache's element
// type (KvElem: bf16; fp8 e4m3 with no scale; or int8, llama.cpp's q8_0
// with one fp16 scale per 32 values, in int8_kv.cuh's block layout):
//   [num_blocks][block_size][num_kv_heads][head_dim]
// Token t of a sequence lives at slot block_table[t / B] * B + t % B; one
// slot holds num_kv_heads * head_dim values (the "slot stride"). int8 pages
// add one fp16 scale per 32 values after each block's values
// (models/cuda/int8_kv.cuh); a block is KvBlockBytes bytes in every type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace kvserve::models::cuda {

using bf16 = __nv_bfloat16;
using fp8 = __nv_fp8_e4m3;

// The element type of the KV planes. fp8 e4m3 stores values as they are
// (scale 1, saturating at +-448): K and V of Llama-family models stay far
// below that, and every fp8 value is exact in bf16, so attention reads a
// tile of fp8 into the same bf16 shared-memory tile as a bf16 cache.
// int8 is llama.cpp's q8_0 (34 bytes per 32 values, as the CPU's int8 KV):
// attention converts each value times its group's scale to bf16 in the
// shared-memory tile.
enum class KvElem : int32_t { kBf16 = 0, kFp8E4M3 = 1, kInt8 = 2 };
// Bytes of one value, scales excluded (int8: 1; see KvBlockBytes).
inline constexpr int KvElemBytes(KvElem e) {
  return e == KvElem::kBf16 ? 2 : 1;
}
// Bytes of one block of one plane (block_size * num_kv_heads * head_dim
// values; int8 adds 2 bytes of scale per 32 values: 17/16 of a byte each).
inline constexpr int64_t KvBlockBytes(KvElem e, int block_size,
                                      int num_kv_heads, int head_dim) {
  const int64_t values =
      static_cast<int64_t>(block_size) * num_kv_heads * head_dim;
  return e == KvElem::kInt8 ? values * 17 / 16 : values * KvElemBytes(e);
}

// ---- attention -------------------------------------------------------------

// One unit of attention work: `num_tokens` consecutive tokens of one
// sequence (rows token..token+num_tokens-1 of q and out) at consecutive
// positions pos0.. . Keys: the sequence's positions [begin, pos] per token
// (begin = pos - window + 1 with a sliding window, else 0).
struct AttnWorkItem {
  int32_t seq = 0;
  int32_t token = 0;
  int32_t num_tokens = 0;
  int32_t pos0 = 0;
};

struct AttnShape {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // 64 or 128
  int32_t block_size = 0;
  int32_t max_blocks_per_seq = 0;
  int32_t sliding_window = 0;  // 0: whole prefix
  float scale = 1.0f;          // applied to q . k
  KvElem kv_elem = KvElem::kBf16;
};

// Host-side plan of one step's attention: the small-group items (up to 8 query
// rows, with split-K along the context: flash-decoding) and the tile items
// (up to 64 query rows: prefill chunks, and decode when the group exceeds 8).
struct AttnPlan {
  std::vector<AttnWorkItem> small;  // rows = num_tokens * group <= 8
  std::vector<AttnWorkItem> tiles;  // rows = num_tokens * group <= 64
  int32_t small_splits = 1, small_partition = 0;  // keys per split
  int32_t tile_splits = 1, tile_partition = 0;
  bool mma_decode = false;  // AttnTuning::mma_decode
};

// How split-K divides a long context when the batch alone does not fill the
// chip: enough splits for about blocks_per_sm thread blocks per
// multiprocessor, none shorter than min_keys_per_split keys (rounded up to
// the 64-key tile). The defaults are unmeasured guesses;
// tools/bench/attention_gpu_bench.cu sweeps them on a device.
// mma_decode: decode items (rows <= 8) on the tensor-core kernel
// (attention_mma.cu: mma.sync m16n8k16, bf16 q and probabilities) instead of
// the fp32 FMA one; off until a device run shows it right and faster.
struct AttnTuning {
  int32_t blocks_per_sm = 4;
  int32_t min_keys_per_split = 256;
  bool mma_decode = false;
};

// Floats of the scratch PagedAttention needs for split-K partials with
// `num_sms` multiprocessors (independent of the batch).
int64_t AttnScratchFloats(const AttnShape& shape, int num_sms,
                          const AttnTuning& tuning = {});

// Groups a step's tokens into work items and picks the split counts.
// seq_starts [S+1], context_lens [S] as in ForwardBatch. group must be <= 64.
AttnPlan PlanAttention(const AttnShape& shape, const int32_t* seq_starts,
                       const int32_t* context_lens, int32_t num_seqs,
                       int num_sms, const AttnTuning& tuning = {});

// out[t, h*D + d] (bf16, rows of num_heads * head_dim) for every token of the
// plan: causal softmax attention of query head h (q fp32 rows, stride
// q_stride floats, query heads first) over the paged K/V of its sequence.
// `items_small` / `items_tiles` are device copies of plan.small / tiles;
// `scratch` holds AttnScratchFloats floats. The caches hold shape.kv_elem.
cudaError_t PagedAttention(const AttnShape& shape, const AttnPlan& plan,
                           const AttnWorkItem* items_small,
                           const AttnWorkItem* items_tiles, const float* q,
                           int64_t q_stride, const void* k_cache,
                           const void* v_cache, const int32_t* block_tables,
                           float* scratch, bf16* out, cudaStream_t stream);

// ---- per-token kernels -----------------------------------------------------

// For each token: adds the q/k/v biases (may be null), rotates the first
// num_heads + num_kv_heads head vectors of its qkv row (fp32, stride
// qkv_stride) by RoPE at positions[t] (angles pos * inv_freq[i] in double;
// interleaved pairs (2i, 2i+1) or half-split pairs (i, i + D/2)), keeps the
// rotated q in place and writes rotated k and v, converted to `kv_elem`,
// into the caches at slot_mapping[t] (reshape-and-cache; int8 quantizes
// each 32-value group with its own scale, in blocks of `block_size` slots).
// With rot_k > 0 (int8 only; kvcache::KvRotationFor; 64, 128 or 256), q and
// K are first Hadamard-rotated in chunks of rot_k values and V in chunks of
// rot_v, bit for bit as cpu::HadamardRotate does; the attention output is
// then rotated back by HadamardRows. inv_freq and bias are device arrays.
cudaError_t QkvRopeCache(float* qkv, int64_t num_tokens, int64_t qkv_stride,
                         int num_heads, int num_kv_heads, int head_dim,
                         bool interleaved, const float* inv_freq,
                         const float* bias, const int32_t* positions,
                         const int32_t* slot_mapping, KvElem kv_elem,
                         int block_size, int rot_k, int rot_v, void* k_cache,
                         void* v_cache, cudaStream_t stream);

// In place, each consecutive n values (64, 128 or 256) of num_rows rows of
// row_len bf16: x <- H x with the orthonormal Walsh-Hadamard matrix (its
// own inverse), in fp32, rounded to bf16 once.
cudaError_t HadamardRows(bf16* x, int64_t num_rows, int64_t row_len, int n,
                         cudaStream_t stream);

// Row i of `out` = RmsNorm(x[r] (+ delta[r])) * w, r = rows ? rows[i] : i.
// Without `rows`, x[r] += delta[r] is also stored back (fused residual add).
// eps as in the CPU path: x / sqrt(mean(x^2) + eps).
cudaError_t AddRmsNorm(float* x, const float* delta, const float* w,
                       int64_t num_rows, int64_t hidden, float eps,
                       const int32_t* rows, bf16* out, cudaStream_t stream);
cudaError_t AddRmsNorm(float* x, const float* delta, const float* w,
                       int64_t num_rows, int64_t hidden, float eps,
                       const int32_t* rows, float* out, cudaStream_t stream);

// out[i, j] = silu(gu[i, j]) * gu[i, inter + j]; gu rows are 2 * inter fp32.
cudaError_t SiluMul(const float* gu, int64_t num_rows, int64_t inter, bf16* out,
                    cudaStream_t stream);

// out[r] = the index of the largest value of row r of `logits` (rows x
// vocab, fp32, device), the lowest index on ties: the token
// std::max_element picks from the same row on the host, so greedy decoding
// can leave the logits on the device. Rows are expected NaN-free.
cudaError_t ArgmaxRows(const float* logits, int64_t rows, int64_t vocab,
                       int32_t* out, cudaStream_t stream);

// x[t, :] = fp32(table[ids[t], :]).
cudaError_t EmbeddingGather(const bf16* table, const int32_t* ids,
                            int64_t num_tokens, int64_t hidden, float* x,
                            cudaStream_t stream);

// Whole-block copies in every layer: for each pair (src, dst) of `pairs`
// (device, 2 * num_pairs ints) and each of `num_planes` planes (K and V of
// every layer, plane p at base + p * plane_bytes), block src -> block dst of
// block_bytes bytes each (a multiple of 16; any element type).
cudaError_t CopyKvBlocks(void* base, int64_t plane_bytes, int num_planes,
                         int64_t block_bytes, const int32_t* pairs,
                         int num_pairs, cudaStream_t stream);

// Swap staging: for block i of `blocks` (device, num_blocks ints) and each
// plane p, block blocks[i] of plane p <-> staging bytes [(i * num_planes +
// p) * block_bytes ...] (one block's planes contiguous: the layout of a host
// swap slot, so each block then moves in one copy). to_staging: gather
// (swap out); else scatter (swap in). block_bytes: a multiple of 16.
cudaError_t StageKvBlocks(void* base, int64_t plane_bytes, int num_planes,
                          int64_t block_bytes, const int32_t* blocks,
                          int num_blocks, void* staging, bool to_staging,
                          cudaStream_t stream);

// ---- conversions -----------------------------------------------------------

cudaError_t F32ToBf16(const float* in, int64_t n, bf16* out,
                      cudaStream_t stream);
cudaError_t Bf16ToF32(const bf16* in, int64_t n, float* out,
                      cudaStream_t stream);
// Fills `out` with deterministic pseudo-random values uniform in
// [-scale, scale) from `seed` (benchmarks with random weights).
cudaError_t FillRandomBf16(bf16* out, int64_t n, uint64_t seed, float scale,
                           cudaStream_t stream);
cudaError_t FillF32(float* out, int64_t n, float value, cudaStream_t stream);

}  // namespace kvserve::models::cuda
