// The stored form of one KV block (a disk file; a remote value is the same
// bytes) and its verification. A block is served only when every check
// passes: a hit is never taken on the key alone.
//
//   off   size  field
//   0     8     magic "KVSRVBLK"
//   8     2     format version (1)      10  2  header bytes (4096)
//   12    4     flags (0)
//   16    16    salt (kvtier::ModelKvSalt: fingerprint, dtype, shape, ...)
//   32    16    the weights' fingerprint (diagnostics)
//   48    16    key    64  16  parent key    80  16  namespace
//   96    8     payload bytes                104 8   created, unix ns
//   112   4     writer pid                   116 4   token count
//   120   8     reserved (0)
//   128   16    checksum: XXH3-128 of the header with this field zeroed,
//               then the payload (as stored: sealed bytes when sealed)
//   144   4*n   token ids (int32 little endian), zeros to 4064
//   4064  12    sealed blocks (flags bit 0): the AES-256-GCM nonce
//   4080  16    ... and its tag; bytes 0-127 are the additional data, the
//               token ids and the payload the ciphertext (block_cipher.h)
//   4096  P     payload (the backend's block layout), zeros to a 4 KiB
//               multiple
//
// Files are written whole under a temporary name and renamed, so a reader
// sees a complete file or none; a torn or altered one fails its size or
// checksum. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "kvtier/block_key.h"

namespace kvserve::kvtier {

inline constexpr size_t kHeaderBytes = 4096;
inline constexpr size_t kFileAlign = 4096;
inline constexpr int kMaxBlockTokens = 512;
inline constexpr uint32_t kFlagSealed = 1;

class BlockCipher;  // kvtier/block_cipher.h

// Why a lookup did not become a hit. Every miss is counted by reason.
enum class MissReason {
  kAbsent,       // no such entry
  kChecksum,     // short, torn or altered bytes
  kTokens,       // key, parent, namespace or tokens differ from the request
  kFingerprint,  // another model, KV format or file format
  kDeadline,     // not loaded in time
  kUnavailable,  // the tier is unhealthy or the read failed
};
inline constexpr int kNumMissReasons = 6;
[[nodiscard]] std::string_view MissReasonName(MissReason r);

// A contiguous piece of a block's payload, in payload order.
struct Piece {
  uint8_t* data = nullptr;
  size_t bytes = 0;
};
struct ConstPiece {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
};

struct BlockHeader {
  Key salt = 0;
  Key fingerprint = 0;
  Key key = 0;
  Key parent = 0;
  Key ns = 0;
  uint64_t payload_bytes = 0;
  uint64_t created_unix_ns = 0;
  uint32_t writer_pid = 0;
  std::vector<int32_t> tokens;
};

// Header + payload padded: every stored block of one format has this size.
[[nodiscard]] uint64_t StoredBlockBytes(uint64_t payload_bytes);

// Writes the header into `out` (kHeaderBytes), its checksum taken over
// `payload` (pieces summing to h.payload_bytes).
void EncodeHeader(const BlockHeader& h, absl::Span<const ConstPiece> payload,
                  uint8_t* out);

// What a lookup expects of a stored block.
struct Expected {
  Key salt = 0;
  Key key = 0;
  Key parent = 0;
  Key ns = 0;
  absl::Span<const int32_t> tokens;
  uint64_t payload_bytes = 0;
  // Sealed blocks expected (and their token ids checked by OpenBlock); a
  // plain block then misses as `fingerprint`, and the other way round.
  const BlockCipher* cipher = nullptr;
};

// Writes the header of a sealed block into `out` (kHeaderBytes): its token
// ids and `payload` (a private copy) are encrypted in place, the checksum
// taken over the result. False on an OpenSSL failure.
[[nodiscard]] bool SealBlock(const BlockCipher& cipher, const BlockHeader& h,
                             absl::Span<uint8_t> payload, uint8_t* out);

// A sealed block whose header and checksum passed: decrypts its token ids
// (in `header`) and `payload` in place, then checks the tokens. nullopt on
// a hit; `checksum` when the tag fails (another key, altered bytes),
// `tokens` when they differ.
[[nodiscard]] std::optional<MissReason> OpenBlock(
    const BlockCipher& cipher, uint8_t* header, absl::Span<const Piece> payload,
    const Expected& want);

// Checks a header read from a stored block of `stored_bytes`: nullopt when
// it matches (the payload's checksum still to be checked, and for a sealed
// block its tokens, by OpenBlock), else the miss.
[[nodiscard]] std::optional<MissReason> CheckHeader(const uint8_t* header,
                                                    uint64_t stored_bytes,
                                                    const Expected& want);

// The checksum of a header (as read) and the payload that follows it,
// taken as the payload arrives.
class ChecksumCheck {
 public:
  explicit ChecksumCheck(const uint8_t* header);
  ~ChecksumCheck();
  ChecksumCheck(const ChecksumCheck&) = delete;
  ChecksumCheck& operator=(const ChecksumCheck&) = delete;

  void Add(const uint8_t* data, size_t bytes);
  [[nodiscard]] bool Matches() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  Key stored_ = 0;
};

}  // namespace kvserve::kvtier
