// Tensor element types shared by the GGUF reader, dequantization, and CPU
// kernels. Enum values equal ggml's `ggml_type` ids as stored in GGUF files;
// block structs match ggml's on-disk layouts byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace kvserve::models {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK8_0 = 32;

// Stored as IEEE half (fp16) bit patterns, as in ggml.
struct BlockQ4_0 {
  uint16_t d;              // scale (fp16)
  uint8_t qs[kQK4_0 / 2];  // nibbles: low nibble = element j, high = j + 16
};
struct BlockQ4_1 {
  uint16_t d;  // scale (fp16)
  uint16_t m;  // min (fp16)
  uint8_t qs[kQK4_1 / 2];
};
struct BlockQ8_0 {
  uint16_t d;  // scale (fp16)
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);

struct GgmlTypeTraits {
  std::string_view name;
  int block_size;    // elements per block (1 for plain types); 0 = unknown
  size_t type_size;  // bytes per block
  bool supported;    // kvserve can dequantize / compute with it
};

// Traits of `t`; `block_size == 0` for ids kvserve does not know.
GgmlTypeTraits TypeTraits(GgmlType t);
inline std::string_view TypeName(GgmlType t) { return TypeTraits(t).name; }

// Bytes of a row of `n` elements; n must be a multiple of the block size.
inline size_t RowBytes(GgmlType t, int64_t n) {
  const GgmlTypeTraits tr = TypeTraits(t);
  return tr.block_size == 0
             ? 0
             : static_cast<size_t>(n / tr.block_size) * tr.type_size;
}

// Half-precision conversions (IEEE fp16 and bfloat16), bit exact.
float Fp16ToFp32(uint16_t h);
uint16_t Fp32ToFp16(float f);
inline float Bf16ToFp32(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v{static_cast<uint32_t>(h) << 16};
  return v.f;
}
uint16_t Fp32ToBf16(float f);  // round to nearest even

// Tensor bytes by type name, as the start log and `kvserve plan` show them:
// "92.1 MiB in the file (F32 0.1, Q4_1 63.3, Q8_0 28.7 MiB)".
std::string FileBytesByTypeText(const std::map<std::string, int64_t>& bytes);

}  // namespace kvserve::models
