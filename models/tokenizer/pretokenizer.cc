#include "models/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/tokenizer/utf8.h"

namespace kvserve::models {
namespace {

// llama.cpp's adaptations of the tokenizer.json patterns: "(?i:'s|...)"
// spelled out so that case folding cannot match e.g. U+017F for 's'.
constexpr std::string_view kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kDigitRegex = R"(\p{N})";

struct NamedPre {
  std::string_view name;
  int kind;  // 0 GPT-2, 1 digits + GPT-2, 2 Llama-3, 3 Qwen2
};

constexpr std::array<NamedPre, 20> kNamedPres = {{
    {"", 0},          {"default", 0},   {"gpt2", 0},      {"mpt", 0},
    {"olmo", 0},      {"jais", 0},      {"smollm", 1},    {"starcoder", 1},
    {"refact", 1},    {"command-r", 1}, {"codeshell", 1}, {"exaone", 1},
    {"minerva", 1},   {"llama-bpe", 2}, {"llama3", 2},    {"dbrx", 2},
    {"smaug-bpe", 2}, {"qwen2", 3},     {"stablelm2", 3}, {"hunyuan", 3},
}};

}  // namespace

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
};

PreTokenizer::~PreTokenizer() {
  for (Pattern& p : patterns_) pcre2_code_free(p.code);
}

absl::StatusOr<std::vector<std::string>> PreTokenizer::RegexesForName(
    std::string_view pre) {
  for (const NamedPre& named : kNamedPres) {
    if (named.name != pre) continue;
    switch (named.kind) {
      case 0:
        return std::vector<std::string>{std::string(kGpt2Regex)};
      case 1:
        return std::vector<std::string>{std::string(kDigitRegex),
                                        std::string(kGpt2Regex)};
      case 2:
        return std::vector<std::string>{std::string(kLlama3Regex)};
      default:
        return std::vector<std::string>{std::string(kQwen2Regex)};
    }
  }
  std::vector<std::string> known;
  for (const NamedPre& named : kNamedPres) {
    if (!named.name.empty()) known.emplace_back(named.name);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer pre-tokenizer '", AbslView(pre),
      "' is not supported (known: ", absl::StrJoin(known, ", "), ")"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(
    const std::vector<std::string>& regexes) {
  if (regexes.empty()) {
    return absl::InvalidArgumentError("pre-tokenizer: no regex given");
  }
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  for (const std::string& regex : regexes) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(regex.data()), regex.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                      &offset, nullptr);
    if (code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      return absl::InvalidArgumentError(absl::StrCat(
          "pre-tokenizer regex '", regex, "' does not compile at offset ",
          offset, ": ", reinterpret_cast<const char*>(message.data())));
    }
    // NOTE: JIT is an optimization only; without it matching still works.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    pre->patterns_.push_back(Pattern{code});
  }
  return pre;
}

namespace {

// Splits `piece` into the matches of `code` and the gaps between them.
void SplitPiece(const pcre2_code* code, pcre2_match_data* md,
                std::string_view piece, std::vector<std::string_view>* out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t pos = 0;
  size_t gap_start = 0;
  while (pos < piece.size()) {
    const int rc =
        pcre2_match(code, subject, piece.size(), pos, 0, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a resource limit.
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (end == begin) {  // Empty match: step over one character.
      pos = begin + Utf8CharLen(static_cast<unsigned char>(piece[begin]));
      continue;
    }
    if (begin > gap_start) {
      out->push_back(piece.substr(gap_start, begin - gap_start));
    }
    out->push_back(piece.substr(begin, end - begin));
    pos = end;
    gap_start = end;
  }
  if (gap_start < piece.size()) out->push_back(piece.substr(gap_start));
}

}  // namespace

void PreTokenizer::Split(std::string_view text,
                         std::vector<std::string_view>* words) const {
  if (text.empty()) return;
  std::vector<std::string_view> current = {text};
  std::vector<std::string_view> next;
  for (size_t i = 0; i < patterns_.size(); ++i) {
    pcre2_match_data* md =
        pcre2_match_data_create_from_pattern(patterns_[i].code, nullptr);
    const bool last = i + 1 == patterns_.size();
    std::vector<std::string_view>* sink = last ? words : &next;
    for (std::string_view piece : current) {
      SplitPiece(patterns_[i].code, md, piece, sink);
    }
    pcre2_match_data_free(md);
    if (!last) std::swap(current, next), next.clear();
  }
}

}  // namespace kvserve::models
