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

// Low-bit codes (kv_rows.h): two-bit planes, then int3's high-bit mask.
void SetLowBitCode(std::byte* codes, int bits, int head_dim, int e, int q) {
  const int quarter = head_dim / 4;
  auto* lo = reinterpret_cast<uint8_t*>(codes) + e % quarter;
  const int shift = 2 * (e / quarter);
  *lo = static_cast<uint8_t>((*lo & ~(3 << shift)) | ((q & 3) << shift));
  if (bits == 3) {
    auto* hi = reinterpret_cast<uint8_t*>(codes) + quarter + e / 8;
    const int bit = 1 << (e % 8);
    *hi = static_cast<uint8_t>((q & 4) != 0 ? (*hi | bit) : (*hi & ~bit));
  }
}

// Asymmetric (scale, min) of x[0, n) (stride apart), rounded to fp16; the
// codes use the rounded pair, as the decoders do.
struct LowBitPair {
  uint16_t scale, min;
  float s, m;
};
LowBitPair FitLowBit(const float* x, int64_t stride, int n, int bits) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  LowBitPair p;
  p.scale = FloatToHalf((hi - lo) / static_cast<float>((1 << bits) - 1));
  p.min = FloatToHalf(lo);
  p.s = HalfToFloat(p.scale);
  p.m = HalfToFloat(p.min);
  return p;
}
int LowBitQuantize(float x, const LowBitPair& p, int bits) {
  if (!(p.s > 0.0f)) return 0;
  const long q = std::lround((x - p.m) / p.s);
  return static_cast<int>(std::clamp(q, 0L, (1L << bits) - 1));
}

void EncodeLowBitRow(int bits, const float* x, int head_dim, std::byte* row) {
  constexpr int kG = kvcache::kKvLowBitGroup;
  std::byte* meta = row + head_dim * bits / 8;
  for (int g = 0; g < head_dim / kG; ++g) {
    const LowBitPair p = FitLowBit(x + g * kG, 1, kG, bits);
    StoreU16(p.scale, meta + 4 * g);
    StoreU16(p.min, meta + 4 * g + 2);
    for (int j = 0; j < kG; ++j) {
      SetLowBitCode(row, bits, head_dim, g * kG + j,
                    LowBitQuantize(x[g * kG + j], p, bits));
    }
  }
}

void DecodeLowBitRow(int bits, const std::byte* row, int head_dim, float* out) {
  constexpr int kG = kvcache::kKvLowBitGroup;
  const std::byte* meta = row + head_dim * bits / 8;
  for (int e = 0; e < head_dim; ++e) {
    const int g = e / kG;
    out[e] = std::fma(static_cast<float>(LowBitCode(row, bits, head_dim, e)),
                      HalfToFloat(LoadU16(meta + 4 * g)),
                      HalfToFloat(LoadU16(meta + 4 * g + 2)));
  }
}

}  // namespace

int LowBitCode(const std::byte* codes, int bits, int head_dim, int e) {
  const int quarter = head_dim / 4;
  const auto* c = reinterpret_cast<const uint8_t*>(codes);
  int q = (c[e % quarter] >> (2 * (e / quarter))) & 3;
  if (bits == 3) q |= ((c[quarter + e / 8] >> (e % 8)) & 1) << 2;
  return q;
}

void EncodeKvKeyGroup(KvDtype dtype, const float* x, int64_t x_stride, int n,
                      int head_dim, std::byte* rows, int64_t row_stride) {
  const int bits = kvcache::KvLowBits(dtype);
  KV_CHECK(bits > 0 && n >= 1 && n <= kvcache::kKvKeyGroupTokens,
           "EncodeKvKeyGroup: dtype ", std::string(kvcache::KvDtypeName(dtype)),
           ", rows ", n);
  const int per_row = head_dim / kvcache::kKvKeyGroupTokens;
  const int64_t meta = head_dim * bits / 8;
  for (int c = 0; c < head_dim; ++c) {
    const LowBitPair p = FitLowBit(x + c, x_stride, n, bits);
    std::byte* m = rows + (c / per_row) * row_stride + meta + 4 * (c % per_row);
    StoreU16(p.scale, m);
    StoreU16(p.min, m + 2);
    for (int i = 0; i < n; ++i) {
      SetLowBitCode(rows + i * row_stride, bits, head_dim, c,
                    LowBitQuantize(x[i * x_stride + c], p, bits));
    }
  }
}

void DecodeKvKeyScales(KvDtype dtype, const std::byte* rows, int64_t row_stride,
                       int head_dim, float* scale, float* min) {
  const int bits = kvcache::KvLowBits(dtype);
  const int per_row = head_dim / kvcache::kKvKeyGroupTokens;
  const int64_t meta = head_dim * bits / 8;
  for (int c = 0; c < head_dim; ++c) {
    const std::byte* m =
        rows + (c / per_row) * row_stride + meta + 4 * (c % per_row);
    scale[c] = HalfToFloat(LoadU16(m));
    min[c] = HalfToFloat(LoadU16(m + 2));
  }
}

void DecodeKvKeyRow(KvDtype dtype, const std::byte* rows, int64_t row_stride,
                    int j, int head_dim, float* out) {
  const int bits = kvcache::KvLowBits(dtype);
  float scale[kvcache::kKvLowBitMaxHeadDim], min[kvcache::kKvLowBitMaxHeadDim];
  KV_CHECK(head_dim <= kvcache::kKvLowBitMaxHeadDim,
           "DecodeKvKeyRow: head_dim ", head_dim);
  DecodeKvKeyScales(dtype, rows, row_stride, head_dim, scale, min);
  const std::byte* codes = rows + j * row_stride;
  for (int c = 0; c < head_dim; ++c) {
    out[c] = std::fma(static_cast<float>(LowBitCode(codes, bits, head_dim, c)),
                      scale[c], min[c]);
  }
}

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
    case KvDtype::kInt3:
    case KvDtype::kInt2:
      EncodeLowBitRow(kvcache::KvLowBits(dtype), x, head_dim, row);
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
    case KvDtype::kInt3:
    case KvDtype::kInt2:
      DecodeLowBitRow(kvcache::KvLowBits(dtype), row, head_dim, out);
      return;
    case KvDtype::kFP8:
      break;
  }
  KV_CHECK(false, "DecodeKvRow: no CPU format for KV dtype ",
           std::string(kvcache::KvDtypeName(dtype)));
}

}  // namespace kvserve::models::cpu
