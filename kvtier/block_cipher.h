// At-rest protection of stored KV blocks (--kv-tier-encryption-key-file):
// AES-256-GCM through OpenSSL, a fresh random 96-bit nonce per block, the
// block's identity (salt, key, parent, namespace, sizes) as additional
// data, so a sealed block can be neither read nor moved to another key
// without the key file. The key file holds 32 bytes, raw or as 64 hex
// digits, and must be readable by its owner only. Thread-safe (each call
// has its own cipher context).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvtier/block_codec.h"

namespace kvserve::kvtier {

inline constexpr size_t kNonceBytes = 12;
inline constexpr size_t kTagBytes = 16;

class BlockCipher {
 public:
  using KeyBytes = std::array<uint8_t, 32>;

  // InvalidArgument naming the flag: unreadable, not 32 bytes (raw or
  // hex), or readable by group or others.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BlockCipher>> FromKeyFile(
      const std::string& path);
  explicit BlockCipher(const KeyBytes& key);
  ~BlockCipher();
  BlockCipher(const BlockCipher&) = delete;
  BlockCipher& operator=(const BlockCipher&) = delete;

  // "aes-256-gcm:" + the first 8 bytes of SHA-256(key), hex: salts the
  // tier keys (kvtier::BlockFormat::encryption), reveals nothing usable.
  [[nodiscard]] const std::string& id() const { return id_; }

  // Encrypts `data` (pieces, one stream, in place) authenticating `aad`,
  // under a fresh random nonce; writes nonce and tag. False on an OpenSSL
  // failure.
  [[nodiscard]] bool Seal(absl::Span<const uint8_t> aad,
                          absl::Span<const Piece> data, uint8_t* nonce,
                          uint8_t* tag) const;
  // Decrypts `data` in place; false when the tag does not verify (wrong
  // key, altered bytes or data): the bytes are then garbage.
  [[nodiscard]] bool Open(absl::Span<const uint8_t> aad,
                          absl::Span<const Piece> data, const uint8_t* nonce,
                          const uint8_t* tag) const;

 private:
  KeyBytes key_;
  std::string id_;
};

}  // namespace kvserve::kvtier
