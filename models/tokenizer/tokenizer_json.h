// HF `tokenizers` tokenizer.json (and tokenizer_config.json) -> TokenizerData.
// Owns the mapping from the HF pipeline description to our two tokenizer
// kinds; does not tokenize (tokenizer.h) and does not find files on disk
// beyond reading the one path it is given.
//
// Supported: model.type "BPE" with vocab, merges ("a b" strings or
// ["a", "b"] arrays), byte_fallback, unk_token, ignore_merges; added_tokens
// (special -> kControl, else kUserDefined).
//  * Byte-level BPE when the pre-tokenizer or decoder is ByteLevel. The
//    pre-tokenizer (ByteLevel, or a Sequence of Digits / Split(Isolated) /
//    ByteLevel) becomes TokenizerData.pre_regexes in order, and `pre` names
//    the llama.cpp equivalent when there is one ("gpt2", "smollm",
//    "llama-bpe", "qwen2"; else "custom").
//  * SentencePiece-style BPE when the pre-tokenizer is Metaspace (split must
//    be false; prepend_scheme "always" -> pre "metaspace", "first" ->
//    "metaspace-first") or the normalizer is the legacy Llama
//    Prepend("▁") + Replace(" ", "▁") (pre "llama": llama.cpp prefix rules).
//    "<0xNN>" tokens are kByte.
// Anything else is Unimplemented, naming the field. Normalizers such as NFC
// are ignored (as llama.cpp does).
//
// bos/eos: from a TemplateProcessing post-processor (a leading special
// token is BOS with add_bos; a trailing one is EOS with add_eos), else by
// well-known token names. tokenizer_config.json, when the loader has it, is
// authoritative: apply it with ApplyTokenizerConfig. extra_eos_ids lists the
// well-known end-of-generation control tokens other than eos.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/tokenizer/tokenizer_data.h"

namespace kvserve::models {

// Parses tokenizer.json text. InvalidArgument (malformed JSON or fields) or
// Unimplemented (unsupported pipeline); messages name the JSON field.
[[nodiscard]] absl::StatusOr<TokenizerData> TokenizerDataFromJson(
    std::string_view json_text);

// Reads `path` and parses it (NotFound if it cannot be read); when a
// tokenizer_config.json sits next to it, applies that too
// (ApplyTokenizerConfig). Errors name the file.
[[nodiscard]] absl::StatusOr<TokenizerData> ReadTokenizerJson(
    const std::string& path);

// Applies tokenizer_config.json: bos_token / eos_token / unk_token /
// pad_token (a string or {"content": ...}; must be in the vocab),
// add_bos_token, add_eos_token, chat_template (a string, or a list of
// {"name", "template"} of which "default" is used). Absent keys leave
// `data` unchanged.
[[nodiscard]] absl::Status ApplyTokenizerConfig(std::string_view json_text,
                                                TokenizerData* data);

}  // namespace kvserve::models
