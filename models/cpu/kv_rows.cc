#include "models/cpu/kv_rows.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "common/check.h"

namespace kvserve::models::cpu {
namespace {

using kvcache::KvDtype;
constexpr int kGroup = kvcache::kKvQuantGroup;

void StoreU16(uint16_t v, std::byte* p) { std::memcpy(p, &v, 2); }
uint16_t LoadU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// llama.cpp's quantize_row_q8_0_ref for one block.
void EncodeQ8Block(const float* x, std::byte* b) {
  float amax = 0.0f;
  for (int j = 0; j < kGroup; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreU16(FloatToHalf(d), b);
  auto* q = reinterpret_cast<int8_t*>(b + 2);
  for (int j = 0; j < kGroup; ++j) {
    q[j] = static_cast<int8_t>(std::lround(x[j] * id));
  }
}

// llama.cpp's quantize_row_q4_0_ref for one block.
void EncodeQ4Block(const float* x, std::byte* b) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kGroup; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  StoreU16(FloatToHalf(d), b);
  auto* qs = reinterpret_cast<uint8_t*>(b + 2);
  for (int j = 0; j < kGroup / 2; ++j) {
    const int lo =
        std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int hi = std::min(
        15,
        static_cast<int>(static_cast<int8_t>(x[j + kGroup / 2] * id + 8.5f)));
    qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace

uint16_t FloatToHalf(float f) {
  // Scale into half's range so that the float addition rounds the mantissa
  // to nearest even at half's precision (ggml's portable fp32 -> fp16).
  float base = (std::fabs(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = std::bit_cast<uint32_t>(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = std::bit_cast<uint32_t>(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissa_bits = bits & 0x00000fffu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) |
                               (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

void EncodeKvRow(KvDtype dtype, const float* x, int head_dim, std::byte* row) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(row, x, sizeof(float) * head_dim);
      return;
    case KvDtype::kF16:
      for (int i = 0; i < head_dim; ++i)
        StoreU16(FloatToHalf(x[i]), row + 2 * i);
      return;
    case KvDtype::kBF16:
      for (int i = 0; i < head_dim; ++i)
        StoreU16(FloatToBf16(x[i]), row + 2 * i);
      return;
    case KvDtype::kInt8:
      for (int g = 0; g < head_dim / kGroup; ++g) {
        EncodeQ8Block(x + g * kGroup, row + g * (kGroup + 2));
      }
      return;
    case KvDtype::kInt4:
      for (int g = 0; g < head_dim / kGroup; ++g) {
        EncodeQ4Block(x + g * kGroup, row + g * (kGroup / 2 + 2));
      }
      return;
    case KvDtype::kFP8:
      break;
  }
  KV_CHECK(false, "EncodeKvRow: no CPU format for KV dtype ",
           std::string(kvcache::KvDtypeName(dtype)));
}

void DecodeKvRow(KvDtype dtype, const std::byte* row, int head_dim,
                 float* out) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(out, row, sizeof(float) * head_dim);
      return;
    case KvDtype::kF16:
      for (int i = 0; i < head_dim; ++i)
        out[i] = HalfToFloat(LoadU16(row + 2 * i));
      return;
    case KvDtype::kBF16:
      for (int i = 0; i < head_dim; ++i)
        out[i] = Bf16ToFloat(LoadU16(row + 2 * i));
      return;
    case KvDtype::kInt8:
      for (int g = 0; g < head_dim / kGroup; ++g) {
        const std::byte* b = row + g * (kGroup + 2);
        const float d = HalfToFloat(LoadU16(b));
        const auto* q = reinterpret_cast<const int8_t*>(b + 2);
        for (int j = 0; j < kGroup; ++j) out[g * kGroup + j] = d * q[j];
      }
      return;
    case KvDtype::kInt4:
      for (int g = 0; g < head_dim / kGroup; ++g) {
        const std::byte* b = row + g * (kGroup / 2 + 2);
        const float d = HalfToFloat(LoadU16(b));
        const auto* qs = reinterpret_cast<const uint8_t*>(b + 2);
        for (int j = 0; j < kGroup / 2; ++j) {
          out[g * kGroup + j] = d * static_cast<float>((qs[j] & 0xf) - 8);
          out[g * kGroup + j + kGroup / 2] =
              d * static_cast<float>((qs[j] >> 4) - 8);
        }
      }
      return;
    case KvDtype::kFP8:
      break;
  }
  KV_CHECK(false, "DecodeKvRow: no CPU format for KV dtype ",
           std::string(kvcache::KvDtypeName(dtype)));
}

}  // namespace kvserve::models::cpu
