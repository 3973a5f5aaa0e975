#include "kvtier/block_key.h"

#include <xxhash.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve::kvtier {
namespace {

void AppendField(std::string* out, absl::string_view v) {
  absl::StrAppend(out, v.size(), ":", v, "|");
}

std::optional<uint64_t> ParseHex64(absl::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

}  // namespace

Key ModelKvSalt(const BlockFormat& f) {
  std::string s = "kvserve-kv-v1|";
  AppendField(&s, Hex128(f.fingerprint));
  AppendField(&s, f.kv_dtype);
  for (int32_t v : {f.rotation_k, f.rotation_v, f.block_size, f.num_layers,
                    f.num_kv_heads, f.head_dim, f.tensor_parallel}) {
    AppendField(&s, absl::StrCat(v));
  }
  AppendField(&s, f.numerics);
  AppendField(&s, f.layout);
  AppendField(&s, absl::StrCat(f.payload_bytes));
  // Only when on, so the salts of plain tiers stay what they were.
  if (!f.encryption.empty()) AppendField(&s, f.encryption);
  const XXH128_hash_t h = XXH3_128bits(s.data(), s.size());
  return absl::MakeUint128(h.high64, h.low64);
}

std::string Hex128(Key k) {
  return absl::StrFormat("%016x%016x", absl::Uint128High64(k),
                         absl::Uint128Low64(k));
}

std::optional<Key> ParseHex128(absl::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  const std::optional<uint64_t> hi = ParseHex64(hex.substr(0, 16));
  const std::optional<uint64_t> lo = ParseHex64(hex.substr(16));
  if (!hi || !lo) return std::nullopt;
  return absl::MakeUint128(*hi, *lo);
}

std::string ModelIdFor(Key salt) { return absl::StrCat("kv:", Hex128(salt)); }

uint64_t ScopeTag(absl::string_view model_id, absl::string_view cache_scope) {
  std::string s;
  AppendField(&s, model_id);
  AppendField(&s, cache_scope);
  return XXH3_64bits(s.data(), s.size());
}

std::string BlockFileName(const BlockName& n) {
  return absl::StrFormat("%s.%016x.%016x.kvb", Hex128(n.key), n.scope_tag,
                         n.salt_tag);
}

std::optional<BlockName> ParseBlockFileName(absl::string_view file_name) {
  // 32 + 1 + 16 + 1 + 16 + 4
  if (file_name.size() != 70 || !absl::EndsWith(file_name, ".kvb")) {
    return std::nullopt;
  }
  if (file_name[32] != '.' || file_name[49] != '.') return std::nullopt;
  const std::optional<Key> key = ParseHex128(file_name.substr(0, 32));
  const std::optional<uint64_t> scope = ParseHex64(file_name.substr(33, 16));
  const std::optional<uint64_t> salt = ParseHex64(file_name.substr(50, 16));
  if (!key || !scope || !salt) return std::nullopt;
  return BlockName{*key, *scope, *salt};
}

std::string BlockSubdir(Key key) {
  return absl::StrFormat("%02x", absl::Uint128High64(key) >> 56);
}

}  // namespace kvserve::kvtier
