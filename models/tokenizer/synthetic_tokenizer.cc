#include "models/tokenizer/synthetic_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::models {

absl::StatusOr<TokenizerData> SyntheticTokenizerData(int32_t vocab_size) {
  if (vocab_size <= kSyntheticEosId + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "synthetic tokenizer: vocab_size ", vocab_size, " is below ",
        kSyntheticEosId + 2, " (256 bytes, BOS, EOS and one text token)"));
  }
  TokenizerData d;
  d.model = TokenizerModel::kByteLevelBpe;
  d.pre = "gpt2";
  d.tokens.reserve(vocab_size);
  d.token_types.reserve(vocab_size);
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(ByteLevelSymbol(static_cast<uint8_t>(b)));
    d.token_types.push_back(TokenType::kNormal);
  }
  d.tokens.emplace_back("<|sim_bos|>");
  d.tokens.emplace_back("<|sim_eos|>");
  d.token_types.push_back(TokenType::kControl);
  d.token_types.push_back(TokenType::kControl);
  const std::string space = ByteLevelSymbol(' ');
  for (int32_t id = kSyntheticEosId + 1; id < vocab_size; ++id) {
    d.tokens.push_back(absl::StrCat(space, "t", id));
    d.token_types.push_back(TokenType::kNormal);
  }
  d.bos_id = kSyntheticBosId;
  d.eos_id = kSyntheticEosId;
  d.add_bos = true;
  return d;
}

}  // namespace kvserve::models
