#include "models/ggml_types.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace kvserve::models {

GgmlTypeTraits TypeTraits(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return {"F32", 1, 4, true};
    case GgmlType::kF16:
      return {"F16", 1, 2, true};
    case GgmlType::kBF16:
      return {"BF16", 1, 2, true};
    case GgmlType::kQ4_0:
      return {"Q4_0", 32, 18, true};
    case GgmlType::kQ4_1:
      return {"Q4_1", 32, 20, true};
    case GgmlType::kQ5_0:
      return {"Q5_0", 32, 22, true};
    case GgmlType::kQ5_1:
      return {"Q5_1", 32, 24, true};
    case GgmlType::kQ8_0:
      return {"Q8_0", 32, 34, true};
    case GgmlType::kQ8_1:
      return {"Q8_1", 32, 36, false};
    case GgmlType::kQ2_K:
      return {"Q2_K", 256, 84, true};
    case GgmlType::kQ3_K:
      return {"Q3_K", 256, 110, true};
    case GgmlType::kQ4_K:
      return {"Q4_K", 256, 144, true};
    case GgmlType::kQ5_K:
      return {"Q5_K", 256, 176, true};
    case GgmlType::kQ6_K:
      return {"Q6_K", 256, 210, true};
    case GgmlType::kQ8_K:
      return {"Q8_K", 256, 292, false};
    case GgmlType::kIQ4_NL:
      return {"IQ4_NL", 32, 18, true};
    case GgmlType::kIQ4_XS:
      return {"IQ4_XS", 256, 136, true};
    case GgmlType::kI8:
      return {"I8", 1, 1, false};
    case GgmlType::kI16:
      return {"I16", 1, 2, false};
    case GgmlType::kI32:
      return {"I32", 1, 4, false};
    case GgmlType::kI64:
      return {"I64", 1, 8, false};
    case GgmlType::kF64:
      return {"F64", 1, 8, false};
  }
  return {"unknown", 0, 0, false};
}

float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t Fp32ToFp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  const uint32_t sign = (x >> 16) & 0x8000;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  uint32_t mant = x & 0x7fffff;
  if (exp == 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);  // inf / nan
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;  // overflow -> inf
  if (e <= 0) {                         // subnormal or zero
    if (e < -10) return sign;
    mant |= 0x800000;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return sign | half;
  }
  uint32_t half = sign | (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;  // may carry
  return static_cast<uint16_t>(half);
}

uint16_t Fp32ToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffff) > 0x7f800000) return (x >> 16) | 0x40;  // quiet nan
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

std::string FileBytesByTypeText(const std::map<std::string, int64_t>& bytes) {
  int64_t total = 0;
  std::vector<std::string> parts;
  for (const auto& [type, n] : bytes) {
    total += n;
    parts.push_back(absl::StrFormat("%s %.1f", type, n / 1048576.0));
  }
  return absl::StrFormat("%.1f MiB in the file (%s MiB)", total / 1048576.0,
                         absl::StrJoin(parts, ", "));
}

}  // namespace kvserve::models
