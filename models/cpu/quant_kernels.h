// The int8 path of the CPU GEMM (small m / decode): repacks ggml rows of any
// quantized type into 16-row interleaved tiles (QuantTiles), quantizes
// activations to int8 per 32-block, and multiplies with AVX-512 VNNI
// (VPDPBUSD: unsigned weight bytes x signed activation bytes). Portable
// scalar code computes the same thing where VNNI is unavailable. Owns no
// threads: QuantMatMul splits tiles over kvserve::ParallelFor.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "models/cpu/aligned_buffer.h"
#include "models/cpu/matmul_internal.h"
#include "models/ggml_types.h"

namespace kvserve::models::cpu::internal {

// Packs `rows` ggml rows of `cols` elements (a multiple of the type's block
// size) of a quantized `type` (Q4_0, Q4_1, Q8_0 or decodable: see
// models/quant_blocks.h) starting at `src`.
[[nodiscard]] absl::StatusOr<QuantTiles> PackQuantTiles(GgmlType type,
                                                        const void* src,
                                                        int64_t rows,
                                                        int64_t cols);

// Consecutive rows of one type: a part of a matrix packed from several
// tensors (e.g. Q, K and V of different types, as K-quant mixes store them).
struct QuantRows {
  GgmlType type;
  const void* data;
  int64_t rows;
};

// Packs the row-wise concatenation of `parts`, each of `cols` elements per
// row: rows of one type in that type's kind, several types as one segment
// per run of a type (matmul_internal.h).
[[nodiscard]] absl::StatusOr<QuantTiles> PackQuantTiles(
    const std::vector<QuantRows>& parts, int64_t cols);

// Per 32-block of one activation row.
// NOTE: Q4_1's min term uses s (the sum of the *quantized* block), as ggml's
// Q8_1 does: the result is then exactly dequant(W) . dequant(x), whose error
// sum(w e) involves the centered weights; the exact sum(x) would leave the
// error sum(d q e) with q in 0..15, about twice as large.
struct ActScale {
  float d;  // scale: x ~= d * q
  float s;  // d * sum(q)
  // sum(q) over the block's first 16 and last 16 elements (|sum| <= 2032):
  // adjacent, so one 32-bit broadcast gives a kernel both as an int16 pair.
  int16_t sum_lo;
  int16_t sum_hi;
};

// Activations quantized symmetrically to int8 with one scale per `group`
// elements: 32 as ggml's Q8_0, 256 as its Q8_K (ActScale still per 32-block,
// the 8 blocks of a group sharing d). Reusable scratch: QuantizeActivations
// only grows the buffers.
struct QuantizedActs {
  int group = 32;
  int64_t m = 0;
  int64_t cols = 0;
  int64_t nb = 0;
  AlignedBuffer q;       // m x cols int8
  AlignedBuffer scales;  // m x nb ActScale
  // q + 128 as unsigned bytes (m x cols), only for batches of more than
  // kBiasedActsRows rows quantized per 256: the VPDPBUSD operand of the passes
  // that read a tile unpacked to signed values (quant_kernels.cc).
  AlignedBuffer biased;
  // sum(q) per 32-block as int16 (m x nb), only quantized per 256: the
  // mins' term of the AVX2 K kernels, two blocks per VPMADDWD.
  AlignedBuffer block_sums;

  const int8_t* Row(int64_t i) const { return q.as<int8_t>() + i * cols; }
  const uint8_t* BiasedRow(int64_t i) const {
    return biased.as<uint8_t>() + i * cols;
  }
  const ActScale* Scales(int64_t i) const {
    return scales.as<ActScale>() + i * nb;
  }
  const int16_t* BlockSums(int64_t i) const {
    return block_sums.as<int16_t>() + i * nb;
  }
};

// Batches of more rows than this, quantized per 256, also get
// QuantizedActs::biased.
inline constexpr int64_t kBiasedActsRows = 8;

// Quantizes x (m x cols, cols % group == 0; group 32 or 256) into `out`.
// `portable` forces the scalar code (tests of the fallback on AVX-512
// machines).
void QuantizeActivations(const float* x, int64_t m, int64_t cols,
                         QuantizedActs* out, bool portable = false,
                         int group = 32);

// The activations of one matmul, quantized per 32 and/or per 256; each tile
// kind reads the grouping its ActGroup() names (KV_CHECK that it is there).
struct ActSet {
  const QuantizedActs* per32 = nullptr;
  const QuantizedActs* per256 = nullptr;

  const QuantizedActs& For(const QuantTiles& w) const;
};

// True when w (or one of its segments) reads activations per `group`.
[[nodiscard]] bool NeedsActGroup(const QuantTiles& w, int group);

// Which kernels QuantMatMul runs. kBest: AVX-512 VNNI where compiled in,
// else AVX2 where this CPU has it, else the portable scalar code. The others
// force theirs (tests; kAvx2 only where HaveAvx2Kernels()).
enum class QuantIsa { kBest, kAvx2, kPortable };

// y[i, r] = sum_k x[i, k] W[r, k] for all rows r of w (y row stride =
// w.rows); x given quantized. Parallel over tiles.
// SetSmallTilePrefetch's state (matmul.h): true while tiles of at most
// kSmallTileBytes are prefetched into L1.
inline constexpr size_t kSmallTileBytes = 16 * 1024;
extern std::atomic<bool> small_tiles_to_l1;

void QuantMatMul(const ActSet& acts, const QuantTiles& w, float* y,
                 QuantIsa isa = QuantIsa::kBest);
// The same with one quantization, which must be the one w reads.
inline void QuantMatMul(const QuantizedActs& a, const QuantTiles& w, float* y,
                        QuantIsa isa = QuantIsa::kBest) {
  QuantMatMul(a.group == 256 ? ActSet{nullptr, &a} : ActSet{&a, nullptr}, w, y,
              isa);
}

// True when the AVX-512 VNNI kernels were compiled in.
bool HaveVnniKernels();

// True on an x86 CPU with AVX2, FMA and F16C (the AVX2 kernels, compiled
// into every x86 build, can run).
bool HaveAvx2Kernels();

// Tile t of w (not segmented) against every row of `a`, by the AVX2 kernels
// (models/cpu/quant_kernels_avx2.cc).
void TileAllRowsAvx2(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                     float* y);

// The portable kernels (models/cpu/quant_kernels_portable.cc): x[0, 32 nb)
// quantized per `per` 32-blocks sharing one scale (1: ggml's Q8_0; 8: Q8_K),
// and tile t of w (not segmented) against every row of `a`.
void QuantizeRowPortable(const float* x, int64_t nb, int per, int8_t* q,
                         ActScale* sc);
// QuantizedActs::block_sums of every row, from its ActScales.
void FillBlockSums(QuantizedActs* a);
void TileAllRowsPortable(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                         float* y);

}  // namespace kvserve::models::cpu::internal
