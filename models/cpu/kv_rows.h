// The formats of one KV row (one KV head's head_dim elements of K or V, see
// models/kv_view.h) for every CPU KV dtype, and scalar encode/decode:
//   f32   head_dim floats
//   fp16  head_dim IEEE binary16, round to nearest even
//   bf16  head_dim bfloat16, round to nearest even
//   int8  head_dim / 32 blocks of llama.cpp's q8_0: an fp16 scale d, then 32
//         int8 q; x = d * q, d = max|x| / 127
//   int4  head_dim / 32 blocks of llama.cpp's q4_0: an fp16 scale d, then 16
//         bytes whose low nibbles are elements 0..15 and high nibbles
//         16..31; x = d * (q - 8), d = (the element of largest magnitude) / -8
// The encoders are the write path of the forward pass (and llama.cpp's
// reference quantizers for the two integer types); the decoders are the
// reference the vectorized attention kernel is tested against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcache/kv_sizing.h"

namespace kvserve::models::cpu {

// Writes x[0, head_dim) into `row` (KvRowBytes(dtype, head_dim) bytes).
// Precondition: CheckKvDtypeShape(dtype, head_dim).ok(); dtype is not fp8.
void EncodeKvRow(kvcache::KvDtype dtype, const float* x, int head_dim,
                 std::byte* row);

// Reads `row` back into out[0, head_dim).
void DecodeKvRow(kvcache::KvDtype dtype, const std::byte* row, int head_dim,
                 float* out);

// Scalar conversions, round to nearest even (NaN stays NaN).
[[nodiscard]] uint16_t FloatToHalf(float f);
[[nodiscard]] float HalfToFloat(uint16_t h);
[[nodiscard]] uint16_t FloatToBf16(float f);
[[nodiscard]] float Bf16ToFloat(uint16_t b);

}  // namespace kvserve::models::cpu
