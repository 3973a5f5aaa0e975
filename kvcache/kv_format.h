// KV formats: how one token's K or V row of one head is stored. The leaf
// both sides of the cache include: the engine and the server name a format
// by its enum (names only at the edges: flags, JSON, proto, metric labels),
// the kernels store and read it, sizing (kv_sizing.h) turns it into bytes.
// Pure functions; owns no memory.
//
// Every format's bytes are per row (KvLayout::kPerRow): a row's bytes
// depend only on its length. The low-bit formats (int3, int2) quantize
// keys per channel across groups of kKvKeyGroupTokens tokens (KIVI): a
// key row then decodes only with its group's scales, which the group's
// rows carry in equal parts, so sizing stays per row.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvserve::kvcache {

// KV element types. kInt8 and kInt4 are stored in groups of kKvQuantGroup
// elements along head_dim, each group with one fp16 scale: the layouts of
// llama.cpp's q8_0 (34 bytes per 32) and q4_0 (18 bytes per 32), so kvserve
// and llama.cpp hold the same number of tokens in the same bytes.
//
// kInt3 and kInt2 are KIVI-style (asymmetric: x = code * scale + min, fp16
// scale and min): values per token in groups of kKvLowBitGroup channels,
// keys per channel across the kKvKeyGroupTokens tokens of a key group
// (slots [32j, 32j + 32) of a block). Both rows are head_dim x bits / 8
// bytes of codes and head_dim / 32 (scale, min) pairs: a value row's own
// groups, a key row its share of its group's channels (row j of a group
// holds channels [j * head_dim / 32, (j + 1) * head_dim / 32)). 0.375 and
// 0.5 bytes per element with scales: 5.3x and 4x fewer than fp16.
enum class KvDtype { kF32, kBF16, kF16, kFP8, kInt8, kInt4, kInt3, kInt2 };
inline constexpr int kKvQuantGroup = 32;
inline constexpr int kKvLowBitGroup = 32;
inline constexpr int kKvKeyGroupTokens = 32;
// A key row holds head_dim / kKvKeyGroupTokens channels' pairs, a value row
// head_dim / kKvLowBitGroup groups' pairs: the same bytes only if equal.
// Groups of 32 rather than 16: int3 then beats q4_0's quality at fewer
// bytes (docs/PERFORMANCE.md, "Low-bit KV").
static_assert(kKvLowBitGroup == kKvKeyGroupTokens);
// The CPU decoders keep a key group's scales on the stack.
inline constexpr int kKvLowBitMaxHeadDim = 512;

// Bits per code of a low-bit dtype (kInt3, kInt2); 0 for the others.
[[nodiscard]] constexpr int KvLowBits(KvDtype dtype) {
  return dtype == KvDtype::kInt3 ? 3 : dtype == KvDtype::kInt2 ? 2 : 0;
}

// Accepts (case-insensitive) "f32"/"fp32"/"float32", "bf16"/"bfloat16",
// "f16"/"fp16"/"float16"/"half", "fp8"/"f8"/"fp8_e4m3"/"e4m3",
// "int8"/"i8"/"q8_0", "int4"/"i4"/"q4_0", "int3"/"i3", "int2"/"i2".
// InvalidArgument listing the accepted names otherwise.
[[nodiscard]] absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name);
// Storage bytes per KV element, group scales included: 4, 2, 2, 1, 1.0625,
// 0.5625, 0.625, 0.5.
[[nodiscard]] double KvBytesPerElement(KvDtype dtype);
// Bytes of one KV head's K (or V) row of `head_dim` elements, scales
// included. Quantized dtypes round head_dim up to whole groups (a shape that
// is not a multiple of the group is refused by CheckKvDtypeShape).
[[nodiscard]] int64_t KvRowBytes(KvDtype dtype, int head_dim);
// OK iff rows of `head_dim` elements can be stored as `dtype`; otherwise
// InvalidArgument naming the dtype and the constraint. (The low-bit
// dtypes also need blocks of whole key groups: CheckKvDtypeBlockSize.)
[[nodiscard]] absl::Status CheckKvDtypeShape(KvDtype dtype, int head_dim);
// OK iff a block of `block_size` tokens holds whole key groups of `dtype`
// (a multiple of kKvKeyGroupTokens for the low-bit dtypes).
[[nodiscard]] absl::Status CheckKvDtypeBlockSize(KvDtype dtype, int block_size);
// The block size `dtype` gets when none was asked for: `block_size` (the
// default), rounded up to whole key groups for the low-bit dtypes.
[[nodiscard]] int KvDtypeDefaultBlockSize(KvDtype dtype, int block_size);
// Canonical short name: "f32", "bf16", "fp16", "fp8", "int8", "int4",
// "int3", "int2".
[[nodiscard]] std::string_view KvDtypeName(KvDtype dtype);

// Sizes of the orthonormal Walsh-Hadamard rotations a forward applies to
// each head's Q and K (k) and V (v) before storing them in a KV dtype, in
// consecutive chunks of that many elements (0: none). Integer dtypes
// quantize 32-element groups with one scale: a rotation spreads a channel's
// outliers across its chunk, so the scale fits the rest of the group. The
// attention is unchanged, (Q H)(K H)^T = Q K^T, and its output is rotated
// back by the same H (H H = I). As llama.cpp does for quantized KV: k is
// the largest power of two dividing head_dim (at most 256, the largest
// chunk the CUDA kernels rotate), v is 64; none unless head_dim is a
// multiple of 64.
struct KvRotation {
  int k = 0;
  int v = 0;
};
[[nodiscard]] KvRotation KvRotationFor(KvDtype dtype, int head_dim);

// How a format lays out a block's rows.
enum class KvLayout {
  kPerRow,  // a fixed number of bytes per token's row (every KvDtype)
};
[[nodiscard]] constexpr KvLayout KvLayoutOf(KvDtype /*dtype*/) {
  return KvLayout::kPerRow;
}

// Bytes of `block_size` tokens' K (or V) rows of one head of `head_dim`
// elements: block_size x KvRowBytes for a per-row layout.
[[nodiscard]] int64_t KvFormatBlockBytes(KvDtype dtype, int head_dim,
                                         int block_size);

}  // namespace kvserve::kvcache
