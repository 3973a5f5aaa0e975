// Tokenizer: text <-> token ids for byte-level BPE (GPT-2 / Llama-3 /
// SmolLM2 / Qwen2; GGUF "gpt2") and SentencePiece-style BPE with byte
// fallback (Llama-2 / Mistral; GGUF "llama"), built from TokenizerData. Owns
// the vocab lookup, special-token splitting, pre-tokenization and merges.
// Does not own file parsing (gguf_config.h, tokenizer_json.h), incremental
// detokenization (detokenizer.h) or chat formatting (chat_template.h).
//
// Semantics follow llama.cpp (llama-vocab.cpp) so that ids match it on GGUF
// models, and HF `tokenizers` for inputs read from tokenizer.json:
//  * Special tokens: with parse_special, control (and unknown) tokens found
//    in the text are emitted as themselves; user-defined tokens always are.
//    Matching is leftmost-longest; the text between them is encoded
//    normally.
//  * Byte-level BPE: pre-tokenizer regexes by `pre` (pretokenizer.h), bytes
//    mapped with GPT-2's byte<->unicode table, merges by rank.
//  * SentencePiece BPE: spaces become U+2581 "▁". Merges by rank when
//    TokenizerData.merges is non-empty (tokenizer.json), else by score
//    (GGUF, llama.cpp llm_tokenizer_spm). Characters without a token become
//    <0xNN> byte tokens (else unk). The "▁" prefix (add_space_prefix)
//    follows `pre`:
//      "metaspace"        HF Metaspace prepend_scheme "always": every text
//                         fragment not already starting with a space;
//      "metaspace-first"  HF "first": only a fragment at offset 0;
//      anything else      llama.cpp: the first fragment and every fragment
//                         after a special token, even one starting with a
//                         space.
//    Decoding drops one leading space from the first decoded token.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "models/tokenizer/bpe.h"
#include "models/tokenizer/pretokenizer.h"
#include "models/tokenizer/tokenizer_data.h"

namespace kvserve::models {

// Bytes [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const TextRange&) const = default;
};

// The vocab text of byte `b` in a byte-level BPE vocab (GPT-2's
// bytes_to_unicode: "a" for 'a', "Ġ" for ' '), UTF-8.
[[nodiscard]] std::string ByteLevelSymbol(uint8_t b);

class Tokenizer {
 public:
  // Validates `data` (sizes, ids in range, a known `pre`, compilable
  // regexes, well-formed merges) and builds the lookup tables.
  // InvalidArgument names the offending field.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(
      TokenizerData data);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text`. add_special: prepend BOS / append EOS when the
  // model's add_bos / add_eos say so. parse_special: recognize control
  // tokens written in the text (e.g. "<|im_start|>"); leave it false for
  // untrusted user content. Never fails: a byte without a token is dropped
  // (byte-level BPE, as llama.cpp does) or becomes a <0xNN> byte token,
  // else unk (SentencePiece). Thread-safe.
  [[nodiscard]] std::vector<int32_t> Encode(std::string_view text,
                                            bool add_special,
                                            bool parse_special) const;
  // The same, but control tokens that overlap a range of `plain` (sorted,
  // disjoint byte ranges of `text`: untrusted content inside trusted
  // template text) stay text, as with parse_special off.
  [[nodiscard]] std::vector<int32_t> Encode(
      std::string_view text, bool add_special, bool parse_special,
      const std::vector<TextRange>& plain) const;

  // Text of `ids`; skip_special drops control and unknown tokens.
  // Out-of-range ids are skipped (never a crash). Invalid UTF-8 is replaced
  // with U+FFFD. Thread-safe.
  [[nodiscard]] std::string Decode(absl::Span<const int32_t> ids,
                                   bool skip_special) const;

  // Raw bytes of one token (control tokens: their text), without the
  // first-token space stripping of Decode. "" for an out-of-range id. May
  // be a partial UTF-8 sequence.
  [[nodiscard]] const std::string& TokenToPiece(int32_t id) const;

  // Token text as stored in the vocab ("Ġthe", "▁the", "<|im_end|>").
  [[nodiscard]] std::optional<int32_t> TokenId(std::string_view text) const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const { return data_.bos_id; }
  int32_t eos_id() const { return data_.eos_id; }
  TokenizerModel model() const { return data_.model; }
  // The inputs this tokenizer was built from (vocab, chat template, ...).
  const TokenizerData& data() const { return data_; }

  // End of generation: eos or one of extra_eos_ids.
  [[nodiscard]] bool IsEog(int32_t id) const {
    return InRange(id) && (flags_[id] & kFlagEog) != 0;
  }
  // What Decode(skip_special=true) drops: control and unknown tokens.
  [[nodiscard]] bool IsSpecial(int32_t id) const {
    return InRange(id) && (flags_[id] & kFlagSpecial) != 0;
  }
  // Decode drops one leading space from the first decoded token
  // (SentencePiece with add_space_prefix).
  bool strips_leading_space() const { return strip_leading_space_; }

 private:
  enum class SpmPrefix { kNone, kLlama, kAlways, kFirst };
  static constexpr uint8_t kFlagEog = 1;
  static constexpr uint8_t kFlagSpecial = 2;
  struct Scratch;
  struct Fragment {
    std::string_view text;  // raw text, when token < 0
    int32_t token = -1;
    size_t offset = 0;  // byte offset in the input
  };

  explicit Tokenizer(TokenizerData data) : data_(std::move(data)) {}
  bool InRange(int32_t id) const {
    return id >= 0 && id < static_cast<int32_t>(pieces_.size());
  }

  absl::Status Init();
  absl::Status ValidateIds() const;
  absl::Status BuildMerges();
  void BuildSpecials();
  void BuildPieces();

  void Partition(std::string_view text, bool parse_special,
                 const std::vector<TextRange>& plain,
                 std::vector<Fragment>* out) const;
  void EncodeByteLevel(std::string_view text, Scratch* s,
                       std::vector<int32_t>* out) const;
  void EncodeSpm(std::string_view text, bool prefix, Scratch* s,
                 std::vector<int32_t>* out) const;
  // Byte tokens of `bytes` (else unk, else nothing) appended to `out`.
  void AppendBytes(std::string_view bytes, std::vector<int32_t>* out) const;
  // Replaces ids of -1 (bytes without a token) in out[from:] by unk
  // (SentencePiece with an unk token), else drops them.
  void FixUnknown(size_t from, std::vector<int32_t>* out) const;

  TokenizerData data_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> pieces_;  // id -> decoded bytes
  std::vector<uint8_t> flags_;       // id -> kFlag*
  // Byte-level: id of the token spelling byte b; SentencePiece: <0xNN>.
  std::array<int32_t, 256> byte_token_{};
  // Specials to split on, by first byte, longest first; `always` is false
  // for tokens recognized only with parse_special.
  struct Special {
    int32_t id;
    bool always;
  };
  std::array<std::vector<Special>, 256> specials_;
  bool has_specials_ = false;
  std::unique_ptr<PreTokenizer> pre_;
  BpeRankMerger rank_merger_;
  std::unique_ptr<SpmScoreMerger> score_merger_;
  bool ignore_merges_ = false;
  SpmPrefix spm_prefix_ = SpmPrefix::kNone;
  bool strip_leading_space_ = false;
};

}  // namespace kvserve::models
