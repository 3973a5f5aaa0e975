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
//   int3, int2 (KIVI-style, kvcache/kv_format.h) head_dim x bits / 8 bytes
//         of codes, then head_dim / 32 fp16 (scale, min) pairs; x = code *
//         scale + min, scale = (max - min) / (2^bits - 1). Code planes: the
//         low two bits of element e in byte e % (head_dim / 4) at bit
//         2 * (e / (head_dim / 4)); int3's high bit in the bitmask after
//         them (bit e % 8 of byte e / 8). A value row's pairs are its own
//         groups of 32 elements; key rows come in groups of 32 tokens
//         quantized per channel (EncodeKvKeyGroup), row j holding the pairs
//         of channels [j * head_dim / 32, (j + 1) * head_dim / 32).
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
// For int3/int2 this is the value row (keys: EncodeKvKeyGroup).
void EncodeKvRow(kvcache::KvDtype dtype, const float* x, int head_dim,
                 std::byte* row);

// Reads `row` back into out[0, head_dim) (int3/int2: a value row).
void DecodeKvRow(kvcache::KvDtype dtype, const std::byte* row, int head_dim,
                 float* out);

// The first n (1..32) key rows of one int3/int2 key group: x row i at
// x + i * x_stride, quantized per channel over those n rows. Writes the
// codes of rows [0, n) and the (scale, min) pairs of all 16 rows; `rows`
// is the group's first row, rows `row_stride` bytes apart.
void EncodeKvKeyGroup(kvcache::KvDtype dtype, const float* x, int64_t x_stride,
                      int n, int head_dim, std::byte* rows, int64_t row_stride);

// A key group's per-channel scales and mins, each head_dim floats.
void DecodeKvKeyScales(kvcache::KvDtype dtype, const std::byte* rows,
                       int64_t row_stride, int head_dim, float* scale,
                       float* min);

// Row j of a key group back into out[0, head_dim).
void DecodeKvKeyRow(kvcache::KvDtype dtype, const std::byte* rows,
                    int64_t row_stride, int j, int head_dim, float* out);

// The low-bit code of element e of a row's codes (int3/int2).
[[nodiscard]] int LowBitCode(const std::byte* codes, int bits, int head_dim,
                             int e);

// Scalar conversions, round to nearest even (NaN stays NaN).
[[nodiscard]] uint16_t FloatToHalf(float f);
[[nodiscard]] float HalfToFloat(uint16_t h);
[[nodiscard]] uint16_t FloatToBf16(float f);
[[nodiscard]] float Bf16ToFloat(uint16_t b);

}  // namespace kvserve::models::cpu
