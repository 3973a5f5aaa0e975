// Block hashing for prefix caching: the 128-bit content key of one full KV
// block, chained over the prefix before it and scoped by a namespace (the
// model, the tenant's cache scope and an optional per-request cache salt),
// so that two blocks get the
// same key only when the whole token prefix up to and including them and the
// namespace are equal. Pure functions; owns no state and knows nothing of
// blocks' whereabouts (BlockPool maps keys to blocks).
//
//   ns   = NamespaceHash(model_id, cache_scope, cache_salt)
//   h[0] = HashBlockTokens(kNoParentHash, ns, tokens[0 .. B))
//   h[i] = HashBlockTokens(h[i-1],        ns, tokens[i*B .. (i+1)*B))
//
// Thread safety: the functions are pure and thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvcache/block_pool.h"

namespace kvserve::kvcache {

// The parent of a request's first block.
inline constexpr BlockHash kNoParentHash = 0;

// The namespace key: requests share cached blocks only under equal keys.
// Unambiguous: ("ab", "c") and ("a", "bc") differ. A salt lives inside its
// scope: the same salt in two scopes gives two namespaces.
[[nodiscard]] BlockHash NamespaceHash(absl::string_view model_id,
                                      absl::string_view cache_scope,
                                      absl::string_view cache_salt);
// The default scope ("").
[[nodiscard]] BlockHash NamespaceHash(absl::string_view model_id,
                                      absl::string_view cache_salt);

// XXH3-128 of (parent, namespace, the block's token ids).
[[nodiscard]] BlockHash HashBlockTokens(BlockHash parent, BlockHash ns,
                                        absl::Span<const int32_t> tokens);

// The keys of the full blocks of `tokens` (at most `max_blocks`), chained
// from `parent`: what the pool and the KV tiers look a prefix up by.
[[nodiscard]] std::vector<BlockHash> ChainBlockHashes(
    absl::Span<const int32_t> tokens, BlockHash ns, int block_size,
    int64_t max_blocks, BlockHash parent = kNoParentHash);

// The signature of HashBlockTokens; tests substitute a colliding one.
using BlockHashFn = BlockHash (*)(BlockHash parent, BlockHash ns,
                                  absl::Span<const int32_t> tokens);

}  // namespace kvserve::kvcache
