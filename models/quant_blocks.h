// One decoder for every ggml block type that kvserve reads beyond the plain
// ones: each block becomes small signed integers with a scale and an offset
// per 16 elements, so that element k of the block is exactly
//
//   x[k] = scale[k / 16] * q[k] + offset[k / 16]
//
// in fp32, as ggml computes it (one product and, for types with mins, one
// addition; the products of fp16 scales and small integers are exact).
// Dequantization (models/dequant.cc) reads every quantized block through
// this decoder, and so does the CPU weight packing (models/cpu/quant_pack.cc)
// except where Q4_0, Q4_1 and Q8_0 quants are copied into their own tiles.
#pragma once

#include <cstdint>

#include "models/ggml_types.h"

namespace kvserve::models {

// Elements that share one scale and offset in DecodedBlocks.
inline constexpr int kDecodeGroup = 16;

// True for the types DecodeBlocks handles: Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL,
// IQ4_XS (and Q4_0, Q4_1, Q8_0, whose own fast paths exist elsewhere).
[[nodiscard]] bool IsDecodable(GgmlType type);

// True when the type's offsets can be non-zero (it stores mins): Q4_1, Q5_1,
// Q2_K, Q4_K, Q5_K. For the others DecodeBlocks writes zero offsets.
[[nodiscard]] bool HasOffsets(GgmlType type);

// Decodes the `n` elements (a multiple of the type's block size) at `src`
// into q[n], scale[n / 16] and offset[n / 16]. `type` must be decodable
// (KV_CHECK).
void DecodeBlocks(GgmlType type, const void* src, int64_t n, int8_t* q,
                  float* scale, float* offset);

// The fp16 super-block scales of a K-quant block (Q2_K..Q6_K, IQ4_XS), under
// which its integer sub-scales and mins sit: DecodeBlocks's scale of group g
// is d * sub_scale_g, its offset -(dmin * min_g). dmin is 0 for the types
// without mins; `type` must be one of these (KV_CHECK).
struct SuperScales {
  float d;
  float dmin;
};
[[nodiscard]] SuperScales KSuperScales(GgmlType type, const void* block);

// The IQ4_NL / IQ4_XS code book: a 4-bit index selects one of these values.
inline constexpr int8_t kIq4NlValues[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

}  // namespace kvserve::models
