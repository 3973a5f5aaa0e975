#include "kvcache/block_hash.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvserve::kvcache {
namespace {

BlockHash FromXxh(XXH128_hash_t h) {
  return absl::MakeUint128(h.high64, h.low64);
}

void Store(BlockHash h, uint64_t* out) {
  out[0] = absl::Uint128High64(h);
  out[1] = absl::Uint128Low64(h);
}

}  // namespace

BlockHash NamespaceHash(absl::string_view model_id,
                        absl::string_view cache_scope,
                        absl::string_view cache_salt) {
  // NOTE: length-prefixed so the split between the parts is unambiguous.
  const std::string key =
      absl::StrCat(model_id.size(), ":", model_id, cache_scope.size(), ":",
                   cache_scope, cache_salt.size(), ":", cache_salt);
  return FromXxh(XXH3_128bits(key.data(), key.size()));
}

BlockHash NamespaceHash(absl::string_view model_id,
                        absl::string_view cache_salt) {
  return NamespaceHash(model_id, "", cache_salt);
}

BlockHash HashBlockTokens(BlockHash parent, BlockHash ns,
                          absl::Span<const int32_t> tokens) {
  // Two passes without allocating: the tokens, then (parent, ns, tokens').
  uint64_t words[6];
  Store(parent, words);
  Store(ns, words + 2);
  Store(FromXxh(XXH3_128bits(tokens.data(), tokens.size() * sizeof(int32_t))),
        words + 4);
  return FromXxh(XXH3_128bits(words, sizeof(words)));
}

std::vector<BlockHash> ChainBlockHashes(absl::Span<const int32_t> tokens,
                                        BlockHash ns, int block_size,
                                        int64_t max_blocks, BlockHash parent) {
  std::vector<BlockHash> keys;
  if (block_size <= 0) return keys;
  const int64_t full = static_cast<int64_t>(tokens.size()) / block_size;
  const int64_t n = std::min(full, std::max<int64_t>(max_blocks, 0));
  keys.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    parent =
        HashBlockTokens(parent, ns, tokens.subspan(i * block_size, block_size));
    keys.push_back(parent);
  }
  return keys;
}

}  // namespace kvserve::kvcache
