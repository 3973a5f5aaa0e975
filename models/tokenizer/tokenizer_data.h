// Everything a tokenizer needs, independent of the file it came from. The
// GGUF reader and the tokenizer.json reader fill it; Tokenizer consumes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvserve::models {

enum class TokenizerModel {
  kByteLevelBpe,     // GPT-2 / Llama-3 / SmolLM2 / Qwen2 ("gpt2" in GGUF)
  kSentencePieceBpe  // Llama-2 / Mistral ("llama" in GGUF), byte fallback
};

// Token types as GGUF stores them (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct TokenizerData {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  // Pre-tokenizer name: GGUF "tokenizer.ggml.pre" ("smollm", "llama-bpe",
  // "gpt2", "qwen2", "default", ...) or derived from tokenizer.json.
  std::string pre;
  std::vector<std::string> tokens;     // id -> token text (as stored)
  std::vector<TokenType> token_types;  // same size as tokens (or empty)
  std::vector<float> scores;           // SentencePiece scores (or empty)
  std::vector<std::string> merges;     // "left right", rank = index
  // Explicit pre-tokenizer split regexes (PCRE2 syntax), applied in order
  // like llama.cpp's lists; set by the tokenizer.json reader when the file's
  // pattern has no `pre` name. When non-empty they replace `pre`'s list.
  std::vector<std::string> pre_regexes;
  // A pre-tokenized word found whole in the vocab skips the merges (HF BPE
  // `ignore_merges`). Also implied by pre "llama-bpe"/"llama3" (llama.cpp).
  bool ignore_merges = false;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  std::vector<int32_t> extra_eos_ids;  // e.g. <|eot_id|>, <|im_end|>
  bool add_bos = false;
  bool add_eos = false;
  bool add_space_prefix = false;  // SentencePiece "▁" prefix
  std::string chat_template;      // Jinja source from the model, if any
};

}  // namespace kvserve::models
