// The portable (scalar) kernels of the int8 GEMM path: activation
// quantization and every tile kind, in plain C++ on the layouts of
// matmul_internal.h. They run where no SIMD kernel is compiled in or the
// tests force them, and are the reference the SIMD kernels are tested
// against.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "models/cpu/quant_kernels.h"
#include "models/quant_blocks.h"

namespace kvserve::models::cpu::internal {
namespace {

// Weight k of tile row r in block b, as the unsigned integer the VNNI
// kernel would feed (nibble kinds: u, see NibbleSpec; Q8: q + 128).
int WeightQuant(const QuantTiles& w, const uint8_t* qb, int r, int k) {
  if (w.kind == QuantKind::kQ8_0) {
    return qb[(k / 4) * 64 + r * 4 + k % 4];
  }
  const NibbleSpec s = SpecOf(w.kind);
  const int h = k / 16, g = k % 16 / 4, i = k % 4;
  int u = s.base == 4 ? (qb[g * 64 + r * 4 + i] >> 4 * h) & 0x0f
                      : (qb[h * 64 + r * 4 + i] >> 2 * g) & 0x03;
  for (int p = 0; p < s.planes; ++p) {
    uint64_t mask;
    std::memcpy(&mask, qb + 64 * s.base + 64 * p + 8 * (4 * h + g), 8);
    u |= static_cast<int>(((mask >> (4 * r + i)) & 1) << (s.base + p));
  }
  return s.lut ? kIq4NlValues[u] + 128 : u;
}

// K kinds: per scale group (a 16- or 32-element part of the block) the
// exact int32 dot - zero sum(a), times d * sub-scale, less dmin * min *
// sum(a).
void SuperTileScalar(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                     float* y) {
  const NibbleSpec s = SpecOf(w.kind);
  const uint8_t* tile = w.Tile(t);
  const SuperLayout L = SuperOf(w, s, tile);
  const int64_t valid = std::min<int64_t>(kTileRows, w.rows - t * kTileRows);
  const int per = kQBlock / s.halves;  // elements per scale group
  for (int64_t i = 0; i < a.m; ++i) {
    for (int r = 0; r < valid; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < w.nb; ++b) {
        const uint8_t* qb = tile + b * w.QuantBytesPerBlock();
        const int8_t* aq = a.Row(i) + b * kQBlock;
        const ActScale& sc = a.Scales(i)[b];
        const float d = Fp16ToFp32(L.d[b / 8 * kTileRows + r]);
        // Only the kinds with mins store dmin.
        const float dmin =
            s.mins ? Fp16ToFp32(L.dmin[b / 8 * kTileRows + r]) : 0.0f;
        for (int h = 0; h < s.halves; ++h) {
          const int32_t sum = s.halves == 1 ? sc.sum_lo + sc.sum_hi
                              : h == 0      ? sc.sum_lo
                                            : sc.sum_hi;
          int32_t dot = -s.zero * sum;
          for (int k = per * h; k < per * (h + 1); ++k) {
            dot += WeightQuant(w, qb, r, k) * aq[k];
          }
          const int64_t at = (b * s.halves + h) * kTileRows + r;
          acc += static_cast<float>(dot) *
                 (d * static_cast<float>(L.Sub(s, b, h, r))) * sc.d;
          if (s.mins) {
            acc -= dmin * static_cast<float>(L.Min(s, at)) *
                   (static_cast<float>(sum) * sc.d);
          }
        }
      }
      y[i * w.out_stride + w.out_offset + t * kTileRows + r] = acc;
    }
  }
}

}  // namespace

// x[0, 32 nb) quantized per `per` 32-blocks sharing one scale (1: ggml's
// Q8_0; 8: Q8_K), with the quantized sums of each block and half.
void QuantizeRowPortable(const float* x, int64_t nb, int per, int8_t* q,
                         ActScale* sc) {
  for (int64_t b0 = 0; b0 < nb; b0 += per) {
    float amax = 0.0f;
    for (int64_t j = b0 * kQBlock; j < (b0 + per) * kQBlock; ++j) {
      amax = std::max(amax, std::fabs(x[j]));
    }
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t b = b0; b < b0 + per; ++b) {
      int sums[2] = {0, 0};
      for (int j = 0; j < kQBlock; ++j) {
        const int v = static_cast<int>(std::nearbyint(x[b * kQBlock + j] * id));
        q[b * kQBlock + j] = static_cast<int8_t>(v);
        sums[j / 16] += v;
      }
      sc[b] = {d, d * static_cast<float>(sums[0] + sums[1]),
               static_cast<int16_t>(sums[0]), static_cast<int16_t>(sums[1])};
    }
  }
}

void TileAllRowsPortable(const QuantTiles& w, int64_t t, const QuantizedActs& a,
                         float* y) {
  if (SpecOf(w.kind).super) return SuperTileScalar(w, t, a, y);
  const int64_t nb = w.nb;
  const int64_t qbytes = w.QuantBytesPerBlock();
  const uint8_t* tile = w.Tile(t);
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(tile + nb * qbytes);
  const uint16_t* ms = ds + nb * kTileRows;
  const float offset = w.kind == QuantKind::kQ8_0
                           ? 128.0f
                           : static_cast<float>(SpecOf(w.kind).zero);
  const int64_t valid = std::min<int64_t>(kTileRows, w.rows - t * kTileRows);
  for (int64_t i = 0; i < a.m; ++i) {
    for (int r = 0; r < valid; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* qb = tile + b * qbytes;
        const int8_t* aq = a.Row(i) + b * kQBlock;
        const ActScale& sc = a.Scales(i)[b];
        int dot = 0;
        for (int k = 0; k < kQBlock; ++k)
          dot += WeightQuant(w, qb, r, k) * aq[k];
        const float dw = Fp16ToFp32(ds[b * kTileRows + r]);
        acc += dw * (static_cast<float>(dot) * sc.d - offset * sc.s);
        if (w.kind != QuantKind::kQ8_0 && SpecOf(w.kind).mins) {
          acc += Fp16ToFp32(ms[b * kTileRows + r]) * sc.s;
        }
      }
      y[i * w.out_stride + w.out_offset + t * kTileRows + r] = acc;
    }
  }
}

void FillBlockSums(QuantizedActs* a) {
  a->block_sums.EnsureSize(static_cast<size_t>(a->m * a->nb) * sizeof(int16_t));
  int16_t* bs = a->block_sums.as<int16_t>();
  const ActScale* sc = a->scales.as<ActScale>();
  for (int64_t j = 0; j < a->m * a->nb; ++j) {
    // |sum| <= 32 * 127: an int16.
    bs[j] = static_cast<int16_t>(sc[j].sum_lo + sc[j].sum_hi);
  }
}

}  // namespace kvserve::models::cpu::internal
