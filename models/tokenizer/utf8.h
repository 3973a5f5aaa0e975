// UTF-8 and string helpers of the tokenizer and detokenizer: sequence
// classification with the Unicode "maximal subpart" rule (what Rust's
// from_utf8_lossy and Python's errors="replace" do) and lossy sanitizing.
// Owns no state; knows nothing about tokens.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"
#include "common/strings.h"

namespace kvserve::models {

using ::kvserve::AbslView;

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

enum class Utf8Seq {
  kValid,       // `length` bytes form one well-formed character
  kInvalid,     // `length` bytes (a maximal subpart, >= 1) can never be valid
  kIncomplete,  // the rest of the input is a valid prefix of a character
};

struct Utf8SeqInfo {
  Utf8Seq kind;
  size_t length;
};

// Classifies the sequence starting at s[pos]. Precondition: pos < s.size().
[[nodiscard]] Utf8SeqInfo ClassifyUtf8(std::string_view s, size_t pos);

// Appends to `out` the longest prefix of `in` that can be emitted now: valid
// characters as is, invalid bytes as U+FFFD (one per maximal subpart).
// Returns the number of bytes of `in` consumed; the rest (at most 3 bytes)
// is an incomplete character that may still complete.
size_t AppendCompleteUtf8(std::string_view in, std::string* out);

// `in` with every invalid or incomplete sequence replaced by U+FFFD.
[[nodiscard]] std::string SanitizeUtf8(std::string_view in);

// Length of the UTF-8 character starting with byte `lead` (1 for an invalid
// lead byte, so that scanning always advances).
[[nodiscard]] inline size_t Utf8CharLen(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return lead < 0xF8 ? 4 : 1;
}

// Appends the UTF-8 encoding of code point `cp` (< 0x110000) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace kvserve::models
