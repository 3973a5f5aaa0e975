#include "models/quant_blocks.h"

#include <cstring>
#include <string>

#include "common/check.h"

namespace kvserve::models {
namespace {

constexpr int kQK = 256;  // elements of a K-quant super-block

float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return Fp16ToFp32(h);
}

// Fills the offsets of `groups` 16-element groups with one value.
void SetGroups(float* dst, int groups, float v) {
  for (int g = 0; g < groups; ++g) dst[g] = v;
}

// Q4_0: d * (nibble - 8); Q4_1: d * nibble + m. Low nibble of byte j is
// element j, high nibble element j + 16.
void DecodeQ4Legacy(const uint8_t* b, bool has_min, int8_t* q, float* s,
                    float* o) {
  const float d = Half(b);
  const uint8_t* qs = b + (has_min ? 4 : 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = qs[j] & 0x0f;
    const int hi = qs[j] >> 4;
    q[j] = static_cast<int8_t>(has_min ? lo : lo - 8);
    q[j + 16] = static_cast<int8_t>(has_min ? hi : hi - 8);
  }
  SetGroups(s, 2, d);
  SetGroups(o, 2, has_min ? Half(b + 2) : 0.0f);
}

// Q8_0: d * q.
void DecodeQ8_0(const uint8_t* b, int8_t* q, float* s, float* o) {
  std::memcpy(q, b + 2, 32);
  SetGroups(s, 2, Half(b));
  SetGroups(o, 2, 0.0f);
}

// Q5_0: d * (q - 16); Q5_1: d * q + m. Bit j of the 32-bit qh is bit 4 of
// element j; the low four bits are nibbles as in Q4_0.
void DecodeQ5Legacy(const uint8_t* b, bool has_min, int8_t* q, float* s,
                    float* o) {
  const float d = Half(b);
  const uint8_t* p = b + (has_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 32; ++j) {
    const int nib = j < 16 ? (qs[j] & 0x0f) : (qs[j - 16] >> 4);
    const int v = nib | static_cast<int>(((qh >> j) & 1u) << 4);
    q[j] = static_cast<int8_t>(has_min ? v : v - 16);
  }
  SetGroups(s, 2, d);
  SetGroups(o, 2, has_min ? Half(b + 2) : 0.0f);
}

// The 6-bit scales and mins of Q4_K / Q5_K's eight 32-element sub-blocks,
// packed in 12 bytes: bytes 0-3 hold scales 0-3 (low 6 bits) and the top
// bits of scales 4-7, bytes 4-7 the same for mins, bytes 8-11 the low
// nibbles of scales 4-7 (low) and mins 4-7 (high).
void KScaleMin(const uint8_t* sc, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = sc[j] & 63;
    *min = sc[j + 4] & 63;
  } else {
    *scale = (sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4);
    *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
}

// Q4_K (144 bytes: d, dmin, scales[12], qs[128]) and Q5_K (176 bytes: d,
// dmin, scales[12], qh[32], qs[128]): d * scale_j * q - dmin * min_j per
// 32-element sub-block j. Sub-blocks 2c and 2c+1 are the low and high
// nibbles of qs[32c .. 32c+31]; Q5_K's bit 4 of element l of sub-block j is
// bit j of qh[l].
void DecodeQ45K(const uint8_t* b, bool five, int8_t* q, float* s, float* o) {
  const float d = Half(b);
  const float dmin = Half(b + 2);
  const uint8_t* sc = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int j = 0; j < 8; ++j) {
    int scale = 0;
    int min = 0;
    KScaleMin(sc, j, &scale, &min);
    SetGroups(s + 2 * j, 2, d * static_cast<float>(scale));
    SetGroups(o + 2 * j, 2, -(dmin * static_cast<float>(min)));
    const uint8_t* bytes = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      int v = (bytes[l] >> shift) & 0x0f;
      if (five) v |= ((qh[l] >> j) & 1) << 4;
      q[32 * j + l] = static_cast<int8_t>(v);
    }
  }
}

// Q6_K (210 bytes: ql[128], qh[64], scales int8[16], d): d * scale_g *
// (q - 32) per 16-element group g. In each 128-element half h, element r
// takes its low four bits from ql[64h + r % 64] (shifted by 4 for r >= 64)
// and its top two from qh[32h + r % 32] (shifted by 2 * (r / 32)).
void DecodeQ6K(const uint8_t* b, int8_t* q, float* s, float* o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = Half(b + 208);
  for (int g = 0; g < 16; ++g) s[g] = d * static_cast<float>(scales[g]);
  SetGroups(o, 16, 0.0f);
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 128; ++r) {
      const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
      const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
      q[128 * h + r] = static_cast<int8_t>((lo | hi << 4) - 32);
    }
  }
}

// Q3_K (110 bytes: hmask[32], qs[64], scales[12], d): d * (scale_g - 32) *
// q per 16-element group, q = two low bits - (high bit clear ? 4 : 0).
// Element 128h + 32k + i takes its low bits from qs[32h + i] >> 2k and its
// high bit from hmask[i] >> (4h + k). The 6-bit scales: low nibbles in
// bytes 0-7 (scales 0-7 low, 8-15 high), top two bits in bytes 8-11.
void DecodeQ3K(const uint8_t* b, int8_t* q, float* s, float* o) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = Half(b + 108);
  for (int g = 0; g < 16; ++g) {
    const int lo = (sc[g % 8] >> (4 * (g / 8))) & 0x0f;
    const int hi = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    s[g] = d * static_cast<float>((lo | hi << 4) - 32);
  }
  SetGroups(o, 16, 0.0f);
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128;
    const int k = (e % 128) / 32;
    const int i = e % 32;
    const int low = (qs[32 * h + i] >> (2 * k)) & 3;
    const int high = (hmask[i] >> (4 * h + k)) & 1;
    q[e] = static_cast<int8_t>(low - (high ? 0 : 4));
  }
}

// Q2_K (84 bytes: scales[16], qs[64], d, dmin): d * (scales_g & 15) * q -
// dmin * (scales_g >> 4) per 16-element group; element 128h + 32k + i is
// (qs[32h + i] >> 2k) & 3.
void DecodeQ2K(const uint8_t* b, int8_t* q, float* s, float* o) {
  const uint8_t* sc = b;
  const uint8_t* qs = b + 16;
  const float d = Half(b + 80);
  const float dmin = Half(b + 82);
  for (int g = 0; g < 16; ++g) {
    s[g] = d * static_cast<float>(sc[g] & 0x0f);
    o[g] = -(dmin * static_cast<float>(sc[g] >> 4));
  }
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128;
    const int k = (e % 128) / 32;
    q[e] = static_cast<int8_t>((qs[32 * h + e % 32] >> (2 * k)) & 3);
  }
}

// Sixteen bytes of nibbles as 32 IQ4 code-book values: the low nibble of
// byte j is element j, the high nibble element j + 16.
void Iq4Values(const uint8_t* qs, int8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4NlValues[qs[j] & 0x0f];
    q[j + 16] = kIq4NlValues[qs[j] >> 4];
  }
}

// IQ4_NL (18 bytes: d, qs[16]): d * kIq4NlValues[nibble].
void DecodeIq4Nl(const uint8_t* b, int8_t* q, float* s, float* o) {
  Iq4Values(b + 2, q);
  SetGroups(s, 2, Half(b));
  SetGroups(o, 2, 0.0f);
}

// IQ4_XS (136 bytes: d, scales_h u16, scales_l[4], qs[128]): d * (ls_j -
// 32) * kIq4NlValues[nibble] per 32-element sub-block j, with ls_j's low
// nibble from scales_l[j / 2] and top two bits from scales_h >> 2j; the
// sub-block's nibbles are qs[16j .. 16j+15] as in IQ4_NL.
void DecodeIq4Xs(const uint8_t* b, int8_t* q, float* s, float* o) {
  const float d = Half(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const uint8_t* scales_l = b + 4;
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 8; ++j) {
    const int lo = (scales_l[j / 2] >> (4 * (j % 2))) & 0x0f;
    const int hi = (scales_h >> (2 * j)) & 3;
    SetGroups(s + 2 * j, 2, d * static_cast<float>((lo | hi << 4) - 32));
    Iq4Values(qs + 16 * j, q + 32 * j);
  }
  SetGroups(o, 16, 0.0f);
}

}  // namespace

bool IsDecodable(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ4_XS:
      return true;
    default:
      return false;
  }
}

bool HasOffsets(GgmlType type) {
  return type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 ||
         type == GgmlType::kQ2_K || type == GgmlType::kQ4_K ||
         type == GgmlType::kQ5_K;
}

SuperScales KSuperScales(GgmlType type, const void* block) {
  const auto* b = static_cast<const uint8_t*>(block);
  switch (type) {
    case GgmlType::kQ2_K:
      return {Half(b + 80), Half(b + 82)};
    case GgmlType::kQ3_K:
      return {Half(b + 108), 0.0f};
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {Half(b), Half(b + 2)};
    case GgmlType::kQ6_K:
      return {Half(b + 208), 0.0f};
    case GgmlType::kIQ4_XS:
      return {Half(b), 0.0f};
    default:
      KV_CHECK(false,
               "KSuperScales: not a K-quant: ", std::string(TypeName(type)));
      return {0.0f, 0.0f};
  }
}

void DecodeBlocks(GgmlType type, const void* src, int64_t n, int8_t* q,
                  float* scale, float* offset) {
  KV_CHECK(IsDecodable(type), "DecodeBlocks: type ",
           std::string(TypeName(type)));
  const GgmlTypeTraits tr = TypeTraits(type);
  const auto* p = static_cast<const uint8_t*>(src);
  const int groups = tr.block_size / kDecodeGroup;
  for (int64_t blk = 0; blk < n / tr.block_size; ++blk) {
    const uint8_t* b = p + blk * tr.type_size;
    int8_t* bq = q + blk * tr.block_size;
    float* bs = scale + blk * groups;
    float* bo = offset + blk * groups;
    switch (type) {
      case GgmlType::kQ4_0:
      case GgmlType::kQ4_1:
        DecodeQ4Legacy(b, type == GgmlType::kQ4_1, bq, bs, bo);
        break;
      case GgmlType::kQ5_0:
      case GgmlType::kQ5_1:
        DecodeQ5Legacy(b, type == GgmlType::kQ5_1, bq, bs, bo);
        break;
      case GgmlType::kQ8_0:
        DecodeQ8_0(b, bq, bs, bo);
        break;
      case GgmlType::kQ2_K:
        DecodeQ2K(b, bq, bs, bo);
        break;
      case GgmlType::kQ3_K:
        DecodeQ3K(b, bq, bs, bo);
        break;
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        DecodeQ45K(b, type == GgmlType::kQ5_K, bq, bs, bo);
        break;
      case GgmlType::kQ6_K:
        DecodeQ6K(b, bq, bs, bo);
        break;
      case GgmlType::kIQ4_NL:
        DecodeIq4Nl(b, bq, bs, bo);
        break;
      case GgmlType::kIQ4_XS:
        DecodeIq4Xs(b, bq, bs, bo);
        break;
      default:
        break;
    }
  }
}

}  // namespace kvserve::models
