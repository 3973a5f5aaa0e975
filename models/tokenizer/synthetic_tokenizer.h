// A tokenizer for a model known only by its architecture (a preset served
// on the simulated device without its files): byte-level BPE with no
// merges, so every byte of a text is one token (about four times the
// tokens a trained BPE vocab gives English), plus a BOS and an EOS control
// token; every other id decodes to " t<id>", so a simulated output reads
// as what it is. Clients that need realistic prompt lengths send token ids
// or put the model's own tokenizer file where the resolver finds it.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "models/tokenizer/tokenizer_data.h"

namespace kvserve::models {

// Ids of the synthetic vocab: bytes 0-255 are ids 0-255.
inline constexpr int32_t kSyntheticBosId = 256;
inline constexpr int32_t kSyntheticEosId = 257;

// The vocab of `vocab_size` ids; InvalidArgument below 259 (the bytes, BOS,
// EOS and one text token).
[[nodiscard]] absl::StatusOr<TokenizerData> SyntheticTokenizerData(
    int32_t vocab_size);

}  // namespace kvserve::models
