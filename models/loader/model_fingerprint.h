// The content fingerprint of a model's files: what the KV tiers salt their
// keys with, so a block computed by other weights (a fine-tune under the
// same file name, a requantized file) never answers a lookup. Reads files
// only; knows nothing of tensors or tiers.
//
// GGUF: the file. HF directory: every *.safetensors and *.json in it, by
// name. Each file contributes its name (directories only), its size and
// its bytes: all of them when the files total at most kFullHashBytes, else
// the first 16 MiB (GGUF metadata and tensor table, safetensors headers)
// and 4 KiB at 4096 evenly spaced offsets. A sampled fingerprint misses an
// edit that touches no sampled page (a retrained model changes every page).
#pragma once

#include <cstdint>
#include <string>

#include "absl/numeric/int128.h"
#include "absl/status/statusor.h"

namespace kvserve::models {

inline constexpr uint64_t kFullHashBytes = uint64_t{1} << 30;

struct ModelFingerprint {
  absl::uint128 hash = 0;
  bool full = false;    // every byte hashed (else sampled)
  uint64_t bytes = 0;   // the files' total size
  uint64_t hashed = 0;  // bytes actually read
};

// `path` as OpenModelFiles takes it. `extra` (e.g. the rope scale) enters
// the hash too. Files totalling more than `full_limit` bytes are sampled
// (UINT64_MAX: never). Errors name the path.
[[nodiscard]] absl::StatusOr<ModelFingerprint> FingerprintModel(
    const std::string& path, const std::string& extra,
    uint64_t full_limit = kFullHashBytes);

}  // namespace kvserve::models
