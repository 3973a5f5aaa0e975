// Regex pre-tokenizer of byte-level BPE: splits text into words with a list
// of PCRE2 patterns (UTF-8, Unicode properties), applied in sequence the way
// llama.cpp's unicode_regex_split and HF's Split(behavior="isolated") do:
// each pattern splits every current piece into its matches and the gaps
// between them, and lookarounds never see past the piece. Owns the compiled
// patterns and the table of named patterns (GGUF "tokenizer.ggml.pre"); does
// not own merges or vocab.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::models {

// GPT-2's pattern (HF ByteLevel use_regex=true).
inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // The patterns of a GGUF pre-tokenizer name, as llama.cpp's llama-vocab.cpp
  // lists them: "", "default", "gpt2", "mpt", "olmo", "jais" -> GPT-2;
  // "smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
  // "minerva" -> "\p{N}" then GPT-2 (= HF Digits(individual) + ByteLevel);
  // "llama-bpe", "llama3", "dbrx", "smaug-bpe" -> Llama-3;
  // "qwen2", "stablelm2", "hunyuan" -> Qwen2. InvalidArgument otherwise.
  [[nodiscard]] static absl::StatusOr<std::vector<std::string>> RegexesForName(
      std::string_view pre);

  // Compiles `regexes` (PCRE2 syntax, at least one); InvalidArgument naming
  // the pattern and offset when one does not compile.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(
      const std::vector<std::string>& regexes);

  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the words of `text` (views into it, in order, covering it
  // exactly) to `words`. Invalid UTF-8 never matches a pattern and ends up
  // in gap pieces. Thread-safe.
  void Split(std::string_view text, std::vector<std::string_view>* words) const;

 private:
  struct Pattern;
  PreTokenizer() = default;

  std::vector<Pattern> patterns_;
};

}  // namespace kvserve::models
