#include "kvcache/kv_format.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "common/check.h"

namespace kvserve::kvcache {

absl::StatusOr<KvDtype> ParseKvDtype(std::string_view name) {
  std::string s(name);
  absl::AsciiStrToLower(&s);
  if (s == "f32" || s == "fp32" || s == "float32") return KvDtype::kF32;
  if (s == "bf16" || s == "bfloat16") return KvDtype::kBF16;
  if (s == "f16" || s == "fp16" || s == "float16" || s == "half") {
    return KvDtype::kF16;
  }
  if (s == "fp8" || s == "f8" || s == "fp8_e4m3" || s == "e4m3") {
    return KvDtype::kFP8;
  }
  if (s == "int8" || s == "i8" || s == "q8_0") return KvDtype::kInt8;
  if (s == "int4" || s == "i4" || s == "q4_0") return KvDtype::kInt4;
  if (s == "int3" || s == "i3") return KvDtype::kInt3;
  if (s == "int2" || s == "i2") return KvDtype::kInt2;
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown KV dtype '%s' (expected one of bf16, fp16, fp8, int8, int4, "
      "int3, int2, f32)",
      name));
}

double KvBytesPerElement(KvDtype dtype) {
  return static_cast<double>(KvRowBytes(dtype, kKvQuantGroup)) / kKvQuantGroup;
}

int64_t KvRowBytes(KvDtype dtype, int head_dim) {
  const int64_t d = head_dim;
  const int64_t groups = (d + kKvQuantGroup - 1) / kKvQuantGroup;
  switch (dtype) {
    case KvDtype::kF32:
      return 4 * d;
    case KvDtype::kBF16:
    case KvDtype::kF16:
      return 2 * d;
    case KvDtype::kFP8:
      return d;
    case KvDtype::kInt8:
      return groups * (kKvQuantGroup + 2);
    case KvDtype::kInt4:
      return groups * (kKvQuantGroup / 2 + 2);
    case KvDtype::kInt3:
    case KvDtype::kInt2: {
      // Codes, then one fp16 (scale, min) pair per kKvLowBitGroup elements.
      const int64_t low = (d + kKvLowBitGroup - 1) / kKvLowBitGroup;
      return (d * KvLowBits(dtype) + 7) / 8 + 4 * low;
    }
  }
  KV_CHECK(false, "bad KvDtype ", static_cast<int>(dtype));
}

absl::Status CheckKvDtypeShape(KvDtype dtype, int head_dim) {
  if ((dtype == KvDtype::kInt8 || dtype == KvDtype::kInt4) &&
      head_dim % kKvQuantGroup != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV dtype %s stores groups of %d elements: head_dim %d is not a "
        "multiple of %d",
        KvDtypeName(dtype), kKvQuantGroup, head_dim, kKvQuantGroup));
  }
  if (KvLowBits(dtype) > 0 && head_dim > kKvLowBitMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV dtype %s decodes rows of at most %d elements: head_dim %d",
        KvDtypeName(dtype), kKvLowBitMaxHeadDim, head_dim));
  }
  if (KvLowBits(dtype) > 0 && head_dim % kKvLowBitGroup != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV dtype %s stores groups of %d elements: head_dim %d is not a "
        "multiple of %d",
        KvDtypeName(dtype), kKvLowBitGroup, head_dim, kKvLowBitGroup));
  }
  return absl::OkStatus();
}

absl::Status CheckKvDtypeBlockSize(KvDtype dtype, int block_size) {
  if (KvLowBits(dtype) > 0 && block_size % kKvKeyGroupTokens != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--block-size %d: --kv-cache-dtype %s quantizes keys per channel "
        "across "
        "groups of %d tokens inside a block; use a multiple of %d",
        block_size, KvDtypeName(dtype), kKvKeyGroupTokens, kKvKeyGroupTokens));
  }
  return absl::OkStatus();
}

int KvDtypeDefaultBlockSize(KvDtype dtype, int block_size) {
  if (KvLowBits(dtype) == 0) return block_size;
  return (block_size + kKvKeyGroupTokens - 1) / kKvKeyGroupTokens *
         kKvKeyGroupTokens;
}

KvRotation KvRotationFor(KvDtype dtype, int head_dim) {
  const bool integer = dtype == KvDtype::kInt8 || dtype == KvDtype::kInt4 ||
                       KvLowBits(dtype) > 0;
  if (!integer || head_dim <= 0 || head_dim % 64 != 0) return {};
  return {std::min(head_dim & -head_dim, 256), 64};
}

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kF16:
      return "fp16";
    case KvDtype::kFP8:
      return "fp8";
    case KvDtype::kInt8:
      return "int8";
    case KvDtype::kInt4:
      return "int4";
    case KvDtype::kInt3:
      return "int3";
    case KvDtype::kInt2:
      return "int2";
  }
  KV_CHECK(false, "bad KvDtype ", static_cast<int>(dtype));
}

int64_t KvFormatBlockBytes(KvDtype dtype, int head_dim, int block_size) {
  switch (KvLayoutOf(dtype)) {
    case KvLayout::kPerRow:
      return int64_t{block_size} * KvRowBytes(dtype, head_dim);
  }
  KV_CHECK(false, "bad KvLayout");
}

}  // namespace kvserve::kvcache
