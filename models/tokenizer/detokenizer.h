// Incremental detokenizer: turns a stream of generated token ids into text
// deltas that are always valid UTF-8. Bytes of a character split across
// tokens (byte-level BPE, <0xNN> byte fallback) are held until the
// character completes; bytes that can never complete become U+FFFD at once;
// Flush() turns a held incomplete tail into U+FFFD. Owns only that small
// buffer; the Tokenizer owns the vocab. One Detokenizer per sequence, used
// from one thread at a time; the Tokenizer must outlive it.
//
// The concatenation of every Add() and the final Flush() equals
// Tokenizer::Decode() of the same ids (with the same skip_special) when
// `sequence_start` is true.
#pragma once

#include <cstdint>
#include <string>

#include "models/tokenizer/tokenizer.h"

namespace kvserve::models {

struct DetokenizerOptions {
  // Drop control and unknown tokens (e.g. "<|im_end|>") from the text.
  bool skip_special = true;
  // The ids start a sequence (not a continuation of a prompt): SentencePiece
  // models with add_space_prefix then drop the first token's leading space,
  // as Decode() does. Leave false for generated text that follows a prompt,
  // where "▁Hello" really means " Hello".
  bool sequence_start = false;
};

class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer* tokenizer,
                       DetokenizerOptions options = {})
      : tokenizer_(tokenizer), options_(options) {}

  // Text completed by `id` (often empty while a character is incomplete).
  // Out-of-range ids add nothing.
  [[nodiscard]] std::string Add(int32_t id);
  // Same, appending to `out`.
  void AddTo(int32_t id, std::string* out);

  // The held bytes, an incomplete character as U+FFFD; resets the buffer.
  [[nodiscard]] std::string Flush();

  // Bytes held back waiting for the rest of a character (at most 3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  DetokenizerOptions options_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace kvserve::models
