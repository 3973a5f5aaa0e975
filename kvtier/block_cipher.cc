#include "kvtier/block_cipher.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve::kvtier {
namespace {

constexpr char kFlag[] = "--kv-tier-encryption-key-file";

struct CtxDeleter {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxDeleter>;

// Feeds the pieces through `update` in chunks an int can count.
template <typename Update>
bool ForEachChunk(absl::Span<const Piece> data, Update update) {
  constexpr size_t kChunk = size_t{1} << 30;
  for (const Piece& p : data) {
    for (size_t off = 0; off < p.bytes; off += kChunk) {
      const int n = static_cast<int>(std::min(kChunk, p.bytes - off));
      if (!update(p.data + off, n)) return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlockCipher>> BlockCipher::FromKeyFile(
    const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFlag, " ", path, ": ", std::strerror(errno)));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s: readable by group or others (mode %o): chmod 600", kFlag, path,
        st.st_mode & 07777));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  KeyBytes key{};
  const absl::string_view hex = absl::StripAsciiWhitespace(text);
  if (hex.size() == 64 && std::all_of(hex.begin(), hex.end(), [](char c) {
        return absl::ascii_isxdigit(c);
      })) {
    const std::string raw = absl::HexStringToBytes(hex);
    std::memcpy(key.data(), raw.data(), key.size());
  } else if (text.size() == key.size()) {
    std::memcpy(key.data(), text.data(), key.size());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(kFlag, " ", path,
                     ": must hold a 32-byte key, raw or as 64 hex digits (e.g. "
                     "`openssl rand -hex 32`)"));
  }
  OPENSSL_cleanse(text.data(), text.size());
  auto c = std::make_unique<BlockCipher>(key);
  OPENSSL_cleanse(key.data(), key.size());
  return c;
}

BlockCipher::BlockCipher(const KeyBytes& key) : key_(key) {
  uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(key_.data(), key_.size(), digest);
  id_ = absl::StrCat("aes-256-gcm:",
                     absl::BytesToHexString(absl::string_view(
                         reinterpret_cast<const char*>(digest), 8)));
}

BlockCipher::~BlockCipher() { OPENSSL_cleanse(key_.data(), key_.size()); }

bool BlockCipher::Seal(absl::Span<const uint8_t> aad,
                       absl::Span<const Piece> data, uint8_t* nonce,
                       uint8_t* tag) const {
  if (RAND_bytes(nonce, kNonceBytes) != 1) return false;
  Ctx ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  return ctx != nullptr &&
         EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_.data(),
                            nonce) == 1 &&
         EVP_EncryptUpdate(ctx.get(), nullptr, &n, aad.data(),
                           static_cast<int>(aad.size())) == 1 &&
         ForEachChunk(data,
                      [&](uint8_t* p, int len) {
                        return EVP_EncryptUpdate(ctx.get(), p, &n, p, len) == 1;
                      }) &&
         EVP_EncryptFinal_ex(ctx.get(), nullptr, &n) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes, tag) ==
             1;
}

bool BlockCipher::Open(absl::Span<const uint8_t> aad,
                       absl::Span<const Piece> data, const uint8_t* nonce,
                       const uint8_t* tag) const {
  Ctx ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  uint8_t t[kTagBytes];
  std::memcpy(t, tag, kTagBytes);
  return ctx != nullptr &&
         EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key_.data(),
                            nonce) == 1 &&
         EVP_DecryptUpdate(ctx.get(), nullptr, &n, aad.data(),
                           static_cast<int>(aad.size())) == 1 &&
         ForEachChunk(data,
                      [&](uint8_t* p, int len) {
                        return EVP_DecryptUpdate(ctx.get(), p, &n, p, len) == 1;
                      }) &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes, t) ==
             1 &&
         EVP_DecryptFinal_ex(ctx.get(), nullptr, &n) == 1;
}

}  // namespace kvserve::kvtier
