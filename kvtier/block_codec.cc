#include "kvtier/block_codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "kvtier/block_cipher.h"

namespace kvserve::kvtier {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'R', 'V', 'B', 'L', 'K'};
constexpr uint16_t kVersion = 1;
constexpr size_t kOffSalt = 16;
constexpr size_t kOffFingerprint = 32;
constexpr size_t kOffKey = 48;
constexpr size_t kOffParent = 64;
constexpr size_t kOffNs = 80;
constexpr size_t kOffPayload = 96;
constexpr size_t kOffCreated = 104;
constexpr size_t kOffPid = 112;
constexpr size_t kOffTokens = 116;
constexpr size_t kOffChecksum = 128;
constexpr size_t kOffTokenIds = 144;
constexpr size_t kOffNonce = kHeaderBytes - 32;
constexpr size_t kOffTag = kHeaderBytes - 16;
constexpr size_t kAadBytes = kOffChecksum;
static_assert(kOffTokenIds + 4 * kMaxBlockTokens <= kOffNonce);
static_assert(kOffNonce + kNonceBytes <= kOffTag);

template <typename T>
void Put(uint8_t* out, size_t at, T v) {
  std::memcpy(out + at, &v, sizeof(T));
}
template <typename T>
T Get(const uint8_t* in, size_t at) {
  T v;
  std::memcpy(&v, in + at, sizeof(T));
  return v;
}
void PutKey(uint8_t* out, size_t at, Key k) {
  Put(out, at, absl::Uint128High64(k));
  Put(out, at + 8, absl::Uint128Low64(k));
}
Key GetKey(const uint8_t* in, size_t at) {
  return absl::MakeUint128(Get<uint64_t>(in, at), Get<uint64_t>(in, at + 8));
}

// A streaming XXH3-128.
struct Xxh128 {
  Xxh128() { XXH3_128bits_reset(xxh); }
  ~Xxh128() { XXH3_freeState(xxh); }
  Xxh128(const Xxh128&) = delete;
  Xxh128& operator=(const Xxh128&) = delete;
  XXH3_state_t* xxh = XXH3_createState();
};

}  // namespace

std::string_view MissReasonName(MissReason r) {
  switch (r) {
    case MissReason::kAbsent:
      return "absent";
    case MissReason::kChecksum:
      return "checksum";
    case MissReason::kTokens:
      return "tokens";
    case MissReason::kFingerprint:
      return "fingerprint";
    case MissReason::kDeadline:
      return "deadline";
    case MissReason::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

uint64_t StoredBlockBytes(uint64_t payload_bytes) {
  return kHeaderBytes +
         (payload_bytes + kFileAlign - 1) / kFileAlign * kFileAlign;
}

struct ChecksumCheck::State : Xxh128 {};

namespace {

// Every field but the checksum.
void WriteFields(const BlockHeader& h, uint32_t flags, uint8_t* out) {
  std::memset(out, 0, kHeaderBytes);
  std::memcpy(out, kMagic, sizeof(kMagic));
  Put<uint16_t>(out, 8, kVersion);
  Put<uint16_t>(out, 10, static_cast<uint16_t>(kHeaderBytes));
  Put<uint32_t>(out, 12, flags);
  PutKey(out, kOffSalt, h.salt);
  PutKey(out, kOffFingerprint, h.fingerprint);
  PutKey(out, kOffKey, h.key);
  PutKey(out, kOffParent, h.parent);
  PutKey(out, kOffNs, h.ns);
  Put<uint64_t>(out, kOffPayload, h.payload_bytes);
  Put<uint64_t>(out, kOffCreated, h.created_unix_ns);
  Put<uint32_t>(out, kOffPid, h.writer_pid);
  const size_t n = std::min<size_t>(h.tokens.size(), kMaxBlockTokens);
  Put<uint32_t>(out, kOffTokens, static_cast<uint32_t>(n));
  std::memcpy(out + kOffTokenIds, h.tokens.data(), n * sizeof(int32_t));
}

// The checksum of the header (its field still zero) and the payload.
void WriteChecksum(absl::Span<const ConstPiece> payload, uint8_t* out) {
  Xxh128 s;
  XXH3_128bits_update(s.xxh, out, kHeaderBytes);
  for (const ConstPiece& p : payload) {
    XXH3_128bits_update(s.xxh, p.data, p.bytes);
  }
  const XXH128_hash_t d = XXH3_128bits_digest(s.xxh);
  PutKey(out, kOffChecksum, absl::MakeUint128(d.high64, d.low64));
}

}  // namespace

void EncodeHeader(const BlockHeader& h, absl::Span<const ConstPiece> payload,
                  uint8_t* out) {
  WriteFields(h, 0, out);
  WriteChecksum(payload, out);
}

bool SealBlock(const BlockCipher& cipher, const BlockHeader& h,
               absl::Span<uint8_t> payload, uint8_t* out) {
  WriteFields(h, kFlagSealed, out);
  const size_t n = Get<uint32_t>(out, kOffTokens);
  const Piece pieces[] = {{out + kOffTokenIds, n * sizeof(int32_t)},
                          {payload.data(), payload.size()}};
  if (!cipher.Seal(absl::MakeConstSpan(out, kAadBytes), pieces, out + kOffNonce,
                   out + kOffTag)) {
    return false;
  }
  const ConstPiece sealed{payload.data(), payload.size()};
  WriteChecksum(absl::MakeConstSpan(&sealed, 1), out);
  return true;
}

std::optional<MissReason> OpenBlock(const BlockCipher& cipher, uint8_t* header,
                                    absl::Span<const Piece> payload,
                                    const Expected& want) {
  const size_t n = Get<uint32_t>(header, kOffTokens);
  std::vector<Piece> pieces;
  pieces.reserve(payload.size() + 1);
  pieces.push_back({header + kOffTokenIds, n * sizeof(int32_t)});
  pieces.insert(pieces.end(), payload.begin(), payload.end());
  if (!cipher.Open(absl::MakeConstSpan(header, kAadBytes), pieces,
                   header + kOffNonce, header + kOffTag)) {
    return MissReason::kChecksum;
  }
  if (n != want.tokens.size() ||
      std::memcmp(header + kOffTokenIds, want.tokens.data(),
                  n * sizeof(int32_t)) != 0) {
    return MissReason::kTokens;
  }
  return std::nullopt;
}

std::optional<MissReason> CheckHeader(const uint8_t* header,
                                      uint64_t stored_bytes,
                                      const Expected& want) {
  if (std::memcmp(header, kMagic, sizeof(kMagic)) != 0 ||
      Get<uint16_t>(header, 8) != kVersion ||
      Get<uint16_t>(header, 10) != kHeaderBytes ||
      Get<uint32_t>(header, 12) != (want.cipher != nullptr ? kFlagSealed : 0) ||
      GetKey(header, kOffSalt) != want.salt ||
      Get<uint64_t>(header, kOffPayload) != want.payload_bytes) {
    return MissReason::kFingerprint;
  }
  if (stored_bytes != StoredBlockBytes(want.payload_bytes)) {
    return MissReason::kChecksum;
  }
  const uint32_t n = Get<uint32_t>(header, kOffTokens);
  if (GetKey(header, kOffKey) != want.key ||
      GetKey(header, kOffParent) != want.parent ||
      GetKey(header, kOffNs) != want.ns || n != want.tokens.size() ||
      // Sealed token ids are ciphertext: OpenBlock checks them.
      (want.cipher == nullptr &&
       std::memcmp(header + kOffTokenIds, want.tokens.data(),
                   n * sizeof(int32_t)) != 0)) {
    return MissReason::kTokens;
  }
  return std::nullopt;
}

ChecksumCheck::ChecksumCheck(const uint8_t* header)
    : state_(std::make_unique<State>()), stored_(GetKey(header, kOffChecksum)) {
  uint8_t copy[kHeaderBytes];
  std::memcpy(copy, header, kHeaderBytes);
  std::memset(copy + kOffChecksum, 0, 16);
  XXH3_128bits_update(state_->xxh, copy, kHeaderBytes);
}

ChecksumCheck::~ChecksumCheck() = default;

void ChecksumCheck::Add(const uint8_t* data, size_t bytes) {
  XXH3_128bits_update(state_->xxh, data, bytes);
}

bool ChecksumCheck::Matches() const {
  const XXH128_hash_t d = XXH3_128bits_digest(state_->xxh);
  return absl::MakeUint128(d.high64, d.low64) == stored_;
}

}  // namespace kvserve::kvtier
