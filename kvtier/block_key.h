// Keys of the KV tiers: what a stored block is named by and filed under.
//
// A block's key is the prefix cache's own chained hash
// (kvcache/block_hash.h), whose namespace already holds the tenant's cache
// scope and the request's cache_salt. What the pool leaves out, because it
// is constant within one process, is salted in through the namespace's
// model id: the weights' content fingerprint, the KV dtype and its
// rotation, the block size and shape, the tensor-parallel degree and the
// backend's KV numerics and layout versions (a kernel change that alters
// KV bytes bumps the numerics version and orphans old entries).
//
//   salt     = XXH3-128("kvserve-kv-v1" | every BlockFormat field)
//   model_id = "kv:" + hex(salt)          (the namespace's model part)
//   disk     DIR/kvserve-v1/<salt>/<key[0:2]>/<key>.<scope_tag>.<salt_tag>.kvb
//
// scope_tag (XXH3-64 of the model id and the cache scope) and salt_tag (the
// low 64 bits of the namespace) let an admin purge a tenant's or a salt's
// blocks without storing the names. Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/strings/string_view.h"

namespace kvserve::kvtier {

using Key = absl::uint128;

// What a block's KV bytes depend on besides its tokens and their prefix.
struct BlockFormat {
  Key fingerprint = 0;   // models::FingerprintModel
  std::string kv_dtype;  // kvcache::KvDtypeName
  int32_t rotation_k = 0;
  int32_t rotation_v = 0;
  int32_t block_size = 0;
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t tensor_parallel = 1;
  std::string numerics;        // the backend's KV numerics version, "cpu-n1"
  std::string layout;          // the backend's block byte layout, "cpu-rows-v1"
  uint64_t payload_bytes = 0;  // one block's KV bytes, every layer
  // BlockCipher::id() when blocks are sealed, else empty: a key of its own
  // names its own blocks (another key's are never read, so never deleted).
  std::string encryption;
};

[[nodiscard]] Key ModelKvSalt(const BlockFormat& format);
// 32 lowercase hex digits, high half first.
[[nodiscard]] std::string Hex128(Key k);
[[nodiscard]] std::optional<Key> ParseHex128(absl::string_view hex);
// The prefix cache's model id under a tiers' salt.
[[nodiscard]] std::string ModelIdFor(Key salt);
// Purge tags (above).
[[nodiscard]] uint64_t ScopeTag(absl::string_view model_id,
                                absl::string_view cache_scope);
[[nodiscard]] inline uint64_t SaltTag(Key ns) { return absl::Uint128Low64(ns); }

// A stored block's file name and what it encodes.
struct BlockName {
  Key key = 0;
  uint64_t scope_tag = 0;
  uint64_t salt_tag = 0;
};
[[nodiscard]] std::string BlockFileName(const BlockName& name);
// nullopt for names that are not a block file's (temporary files included).
[[nodiscard]] std::optional<BlockName> ParseBlockFileName(
    absl::string_view file_name);
// The subdirectory (two hex digits) a key is filed under.
[[nodiscard]] std::string BlockSubdir(Key key);

}  // namespace kvserve::kvtier
