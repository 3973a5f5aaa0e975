#include "models/dequant.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/quant_blocks.h"

namespace kvserve::models {
namespace {

void DequantF16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = Fp16ToFp32(h);
  }
}

void DequantBf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = Bf16ToFp32(h);
  }
}

// Every quantized type through its one decoder: scale * q + offset per 16
// elements. A super-block at a time, so the
// scratch stays on the stack.
void DequantDecoded(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
  const GgmlTypeTraits tr = TypeTraits(type);
  int8_t q[256];
  float scale[256 / kDecodeGroup];
  float offset[256 / kDecodeGroup];
  for (int64_t b = 0; b < n / tr.block_size; ++b) {
    DecodeBlocks(type, src + b * tr.type_size, tr.block_size, q, scale, offset);
    float* y = dst + b * tr.block_size;
    for (int k = 0; k < tr.block_size; ++k) {
      const int g = k / kDecodeGroup;
      y[k] = scale[g] * static_cast<float>(q[k]) + offset[g];
    }
  }
}

// Checks that `t` is a well-formed tensor of a supported type; returns its
// row length (shape[0]) and row count.
absl::Status CheckTensor(const RawTensor& t, int64_t* row_len, int64_t* rows) {
  const GgmlTypeTraits tr = TypeTraits(t.type);
  if (!tr.supported) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": cannot dequantize type ", std::string(tr.name),
        " (id ", static_cast<uint32_t>(t.type), ")"));
  }
  *row_len = t.shape.empty() ? 1 : t.shape[0];
  *rows = *row_len == 0 ? 0 : t.NumElements() / *row_len;
  if (*row_len % tr.block_size != 0 || (t.data == nullptr && t.nbytes > 0) ||
      t.nbytes != RowBytes(t.type, *row_len) * static_cast<size_t>(*rows)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": ", t.nbytes,
        " bytes do not match its shape and type ", std::string(tr.name)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DequantizeRow(GgmlType type, const void* src, float* dst,
                           int64_t n) {
  const GgmlTypeTraits tr = TypeTraits(type);
  if (!tr.supported) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot dequantize ggml type ", std::string(tr.name),
                     " (id ", static_cast<uint32_t>(type), ")"));
  }
  if (n < 0 || n % tr.block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantize ", std::string(tr.name), ": element count ", n,
                     " is not a multiple of the block size ", tr.block_size));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, s, n * sizeof(float));
      break;
    case GgmlType::kF16:
      DequantF16(s, dst, n);
      break;
    case GgmlType::kBF16:
      DequantBf16(s, dst, n);
      break;
    default:
      if (!IsDecodable(type)) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot dequantize ggml type ", std::string(tr.name)));
      }
      DequantDecoded(type, s, dst, n);
  }
  return absl::OkStatus();
}

absl::Status DequantizeTensorRow(const RawTensor& t, int64_t row, float* dst) {
  int64_t row_len = 0;
  int64_t rows = 0;
  KV_RETURN_IF_ERROR(CheckTensor(t, &row_len, &rows));
  if (row < 0 || row >= rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": row ", row, " out of range [0, ", rows, ")"));
  }
  const auto* base = static_cast<const uint8_t*>(t.data);
  return DequantizeRow(t.type, base + row * RowBytes(t.type, row_len), dst,
                       row_len);
}

absl::StatusOr<std::vector<float>> DequantizeTensor(const RawTensor& t) {
  int64_t row_len = 0;
  int64_t rows = 0;
  KV_RETURN_IF_ERROR(CheckTensor(t, &row_len, &rows));
  std::vector<float> out(static_cast<size_t>(row_len * rows));
  KV_RETURN_IF_ERROR(DequantizeRow(t.type, t.data, out.data(), row_len * rows));
  return out;
}

}  // namespace kvserve::models
