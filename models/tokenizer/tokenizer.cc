#include "models/tokenizer/tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "models/tokenizer/utf8.h"

namespace kvserve::models {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the other
// 68 to U+0100 onwards, in byte order.
const std::array<char32_t, 256>& ByteToUnicode() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) ||
                             (b >= 174 && b <= 255);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

// Inverse of ByteToUnicode() for code points below 512; -1 elsewhere.
const std::array<int16_t, 512>& UnicodeToByte() {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[ByteToUnicode()[b]] = b;
    return t;
  }();
  return table;
}

// Decodes one code point at s[*pos] (valid UTF-8 expected); advances *pos.
// Returns -1 (and advances one byte) on an invalid sequence.
int32_t NextCodePoint(std::string_view s, size_t* pos) {
  const Utf8SeqInfo seq = ClassifyUtf8(s, *pos);
  if (seq.kind != Utf8Seq::kValid) {
    *pos += 1;
    return -1;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + *pos);
  *pos += seq.length;
  switch (seq.length) {
    case 1:
      return p[0];
    case 2:
      return ((p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3:
      return ((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return ((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) |
             ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
  }
}

// Byte-level token text -> bytes ("Ġthe" -> " the").
std::string ByteLevelDecode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const int32_t cp = NextCodePoint(text, &pos);
    if (cp >= 0 && cp < 512 && UnicodeToByte()[cp] >= 0) {
      out.push_back(static_cast<char>(UnicodeToByte()[cp]));
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  return out;
}

// "<0xNN>" -> NN; -1 if `text` is not a byte token.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') {
    return -1;
  }
  int value = 0;
  for (char c : text.substr(3, 2)) {
    value *= 16;
    if (c >= '0' && c <= '9') {
      value += c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value += c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value += c - 'a' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

std::string ReplaceAll(std::string_view s, std::string_view from,
                       std::string_view to) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0;;) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) {
      out.append(s.substr(pos));
      return out;
    }
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
}

}  // namespace

std::string ByteLevelSymbol(uint8_t b) {
  std::string text;
  AppendUtf8(ByteToUnicode()[b], &text);
  return text;
}

struct Tokenizer::Scratch {
  std::vector<Fragment> fragments;
  std::vector<std::string_view> words;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<std::pair<uint32_t, uint32_t>> pieces;
  BpeRankMerger::Scratch rank;
  SpmScoreMerger::Scratch score;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(
    TokenizerData data) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer(std::move(data)));
  KV_RETURN_IF_ERROR(tok->Init());
  return tok;
}

absl::Status Tokenizer::Init() {
  KV_RETURN_IF_ERROR(ValidateIds());
  const int32_t n = static_cast<int32_t>(data_.tokens.size());
  token_to_id_.reserve(n);
  for (int32_t id = 0; id < n; ++id) {
    if (!data_.tokens[id].empty()) token_to_id_.emplace(data_.tokens[id], id);
  }
  const bool byte_level = data_.model == TokenizerModel::kByteLevelBpe;
  for (int b = 0; b < 256; ++b) {
    std::string text;
    if (byte_level) {
      AppendUtf8(ByteToUnicode()[b], &text);
    } else {
      text = absl::StrFormat("<0x%02X>", b);
    }
    const auto it = token_to_id_.find(AbslView(text));
    byte_token_[b] = it == token_to_id_.end() ? -1 : it->second;
  }
  KV_RETURN_IF_ERROR(BuildMerges());
  if (byte_level) {
    std::vector<std::string> regexes = data_.pre_regexes;
    if (regexes.empty()) {
      KV_ASSIGN_OR_RETURN(regexes, PreTokenizer::RegexesForName(data_.pre));
    }
    KV_ASSIGN_OR_RETURN(pre_, PreTokenizer::Create(regexes));
    ignore_merges_ = data_.ignore_merges ||
                     (data_.pre_regexes.empty() &&
                      (data_.pre == "llama-bpe" || data_.pre == "llama3"));
  } else {
    if (data_.merges.empty()) {
      score_merger_ =
          std::make_unique<SpmScoreMerger>(&token_to_id_, &data_.scores);
    }
    if (!data_.add_space_prefix) {
      spm_prefix_ = SpmPrefix::kNone;
    } else if (data_.pre == "metaspace") {
      spm_prefix_ = SpmPrefix::kAlways;
    } else if (data_.pre == "metaspace-first") {
      spm_prefix_ = SpmPrefix::kFirst;
    } else {
      spm_prefix_ = SpmPrefix::kLlama;
    }
    strip_leading_space_ = data_.add_space_prefix;
  }
  BuildPieces();
  BuildSpecials();
  return absl::OkStatus();
}

absl::Status Tokenizer::ValidateIds() const {
  const size_t n = data_.tokens.size();
  if (n == 0 || n > (1u << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: tokens has ", n, " entries"));
  }
  if (!data_.token_types.empty() && data_.token_types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: token_types has ", data_.token_types.size(),
                     " entries for ", n, " tokens"));
  }
  if (!data_.scores.empty() && data_.scores.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: scores has ", data_.scores.size(),
                     " entries for ", n, " tokens"));
  }
  const std::pair<const char*, int32_t> ids[] = {{"bos_id", data_.bos_id},
                                                 {"eos_id", data_.eos_id},
                                                 {"unk_id", data_.unk_id},
                                                 {"pad_id", data_.pad_id}};
  for (const auto& [name, id] : ids) {
    if (id < -1 || id >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: ", name, " = ", id, " is outside the vocab of ", n));
    }
  }
  for (int32_t id : data_.extra_eos_ids) {
    if (id < 0 || id >= static_cast<int64_t>(n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: extra_eos_ids has ", id, ", outside the vocab of ", n));
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::BuildMerges() {
  for (size_t rank = 0; rank < data_.merges.size(); ++rank) {
    const std::string& merge = data_.merges[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos || space + 1 >= merge.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: merges[", rank, "] = '", merge, "' is not 'left right'"));
    }
    const std::string_view left(merge.data(), space);
    const std::string_view right(merge.data() + space + 1,
                                 merge.size() - space - 1);
    const auto l = token_to_id_.find(AbslView(left));
    const auto r = token_to_id_.find(AbslView(right));
    const auto m =
        token_to_id_.find(absl::StrCat(AbslView(left), AbslView(right)));
    // NOTE: merges naming tokens absent from the vocab can never produce a
    // token; they are skipped as llama.cpp effectively does.
    if (l == token_to_id_.end() || r == token_to_id_.end() ||
        m == token_to_id_.end()) {
      continue;
    }
    rank_merger_.Add(l->second, r->second, m->second,
                     static_cast<int32_t>(rank));
  }
  return absl::OkStatus();
}

void Tokenizer::BuildPieces() {
  const size_t n = data_.tokens.size();
  pieces_.resize(n);
  flags_.assign(n, 0);
  const bool byte_level = data_.model == TokenizerModel::kByteLevelBpe;
  for (size_t id = 0; id < n; ++id) {
    const std::string& text = data_.tokens[id];
    const TokenType type =
        data_.token_types.empty() ? TokenType::kNormal : data_.token_types[id];
    if (type == TokenType::kControl || type == TokenType::kUnknown) {
      pieces_[id] = text;
      flags_[id] |= kFlagSpecial;
    } else if (byte_level) {
      pieces_[id] =
          type == TokenType::kUserDefined ? text : ByteLevelDecode(text);
    } else if (const int byte = ParseByteToken(text);
               byte >= 0 &&
               (type == TokenType::kByte || data_.token_types.empty())) {
      pieces_[id] = std::string(1, static_cast<char>(byte));
    } else {
      pieces_[id] = ReplaceAll(text, kSpmSpace, " ");
    }
  }
  if (data_.eos_id >= 0) flags_[data_.eos_id] |= kFlagEog;
  for (int32_t id : data_.extra_eos_ids) flags_[id] |= kFlagEog;
}

void Tokenizer::BuildSpecials() {
  if (data_.token_types.empty()) return;
  for (size_t id = 0; id < data_.tokens.size(); ++id) {
    const TokenType type = data_.token_types[id];
    const std::string& text = data_.tokens[id];
    if (text.empty()) continue;
    if (type != TokenType::kControl && type != TokenType::kUnknown &&
        type != TokenType::kUserDefined) {
      continue;
    }
    specials_[static_cast<uint8_t>(text[0])].push_back(
        {static_cast<int32_t>(id), type == TokenType::kUserDefined});
    has_specials_ = true;
  }
  for (auto& list : specials_) {
    std::stable_sort(
        list.begin(), list.end(), [&](const Special& a, const Special& b) {
          return data_.tokens[a.id].size() > data_.tokens[b.id].size();
        });
  }
}

void Tokenizer::Partition(std::string_view text, bool parse_special,
                          const std::vector<TextRange>& plain,
                          std::vector<Fragment>* out) const {
  size_t raw_start = 0;
  size_t next_plain = 0;  // the first range of `plain` that ends after pos
  if (has_specials_) {
    for (size_t pos = 0; pos < text.size();) {
      while (next_plain < plain.size() && plain[next_plain].end <= pos) {
        ++next_plain;
      }
      int32_t match = -1;
      for (const Special& s : specials_[static_cast<uint8_t>(text[pos])]) {
        const std::string& piece = data_.tokens[s.id];
        const bool in_plain = next_plain < plain.size() &&
                              plain[next_plain].begin < pos + piece.size();
        if ((s.always || (parse_special && !in_plain)) &&
            text.substr(pos).starts_with(piece)) {
          match = s.id;
          break;
        }
      }
      if (match < 0) {
        ++pos;
        continue;
      }
      if (pos > raw_start) {
        out->push_back(
            {text.substr(raw_start, pos - raw_start), -1, raw_start});
      }
      out->push_back({{}, match, pos});
      pos += data_.tokens[match].size();
      raw_start = pos;
    }
  }
  if (raw_start < text.size()) {
    out->push_back({text.substr(raw_start), -1, raw_start});
  }
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  return Encode(text, add_special, parse_special, {});
}

std::vector<int32_t> Tokenizer::Encode(
    std::string_view text, bool add_special, bool parse_special,
    const std::vector<TextRange>& plain) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && data_.add_bos && data_.bos_id >= 0) {
    out.push_back(data_.bos_id);
  }
  Scratch s;
  Partition(text, parse_special, plain, &s.fragments);
  bool after_special = true;  // llama.cpp: prefix the first fragment too
  for (const Fragment& f : s.fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    const size_t from = out.size();
    if (data_.model == TokenizerModel::kByteLevelBpe) {
      EncodeByteLevel(f.text, &s, &out);
    } else {
      const bool starts_with_space =
          f.text.front() == ' ' || f.text.starts_with(kSpmSpace);
      bool prefix = false;
      switch (spm_prefix_) {
        case SpmPrefix::kNone:
          break;
        case SpmPrefix::kLlama:
          prefix = after_special;
          break;
        case SpmPrefix::kAlways:
          prefix = !starts_with_space;
          break;
        case SpmPrefix::kFirst:
          prefix = f.offset == 0 && !starts_with_space;
          break;
      }
      EncodeSpm(f.text, prefix, &s, &out);
    }
    FixUnknown(from, &out);
    after_special = false;
  }
  if (add_special && data_.add_eos && data_.eos_id >= 0) {
    out.push_back(data_.eos_id);
  }
  return out;
}

void Tokenizer::EncodeByteLevel(std::string_view text, Scratch* s,
                                std::vector<int32_t>* out) const {
  s->words.clear();
  pre_->Split(text, &s->words);
  for (std::string_view word : s->words) {
    if (ignore_merges_) {
      s->text.clear();
      for (char c : word) AppendUtf8(ByteToUnicode()[uint8_t(c)], &s->text);
      const auto it = token_to_id_.find(s->text);
      if (it != token_to_id_.end()) {
        out->push_back(it->second);
        continue;
      }
    }
    s->ids.clear();
    for (char c : word) s->ids.push_back(byte_token_[static_cast<uint8_t>(c)]);
    rank_merger_.Merge(s->ids, &s->rank, out);
  }
}

void Tokenizer::EncodeSpm(std::string_view text, bool prefix, Scratch* s,
                          std::vector<int32_t>* out) const {
  s->text.clear();
  if (prefix) s->text.append(kSpmSpace);
  for (char c : text) {
    if (c == ' ') {
      s->text.append(kSpmSpace);
    } else {
      s->text.push_back(c);
    }
  }
  const std::string_view escaped = s->text;
  if (score_merger_ == nullptr) {  // Rank-driven (tokenizer.json).
    s->ids.clear();
    for (size_t pos = 0; pos < escaped.size();) {
      const size_t len =
          std::min(Utf8CharLen(static_cast<unsigned char>(escaped[pos])),
                   escaped.size() - pos);
      const auto it = token_to_id_.find(AbslView(escaped.substr(pos, len)));
      if (it != token_to_id_.end()) {
        s->ids.push_back(it->second);
      } else {
        AppendBytes(escaped.substr(pos, len), &s->ids);
      }
      pos += len;
    }
    rank_merger_.Merge(s->ids, &s->rank, out);
    return;
  }
  s->pieces.clear();
  score_merger_->Merge(escaped, &s->score, &s->pieces);
  for (const auto& [begin, size] : s->pieces) {
    const std::string_view piece = escaped.substr(begin, size);
    const auto it = token_to_id_.find(AbslView(piece));
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
    } else {
      AppendBytes(piece, out);
    }
  }
}

void Tokenizer::AppendBytes(std::string_view bytes,
                            std::vector<int32_t>* out) const {
  for (char c : bytes) out->push_back(byte_token_[static_cast<uint8_t>(c)]);
}

void Tokenizer::FixUnknown(size_t from, std::vector<int32_t>* out) const {
  auto& v = *out;
  if (std::find(v.begin() + from, v.end(), -1) == v.end()) return;
  // NOTE: byte-level BPE drops bytes without a token as llama.cpp and HF
  // (no unk_token) do; SmolLM2's unk is <|endoftext|>, which must not be
  // injected into a prompt.
  if (data_.unk_id >= 0 && data_.model == TokenizerModel::kSentencePieceBpe) {
    std::replace(v.begin() + from, v.end(), -1, data_.unk_id);
  } else {
    v.erase(std::remove(v.begin() + from, v.end(), -1), v.end());
  }
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids,
                              bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (!InRange(id) || (skip_special && IsSpecial(id))) continue;
    std::string_view piece = pieces_[id];
    if (first && strip_leading_space_ && piece.starts_with(' ')) {
      piece.remove_prefix(1);
    }
    first = false;
    bytes.append(piece);
  }
  return SanitizeUtf8(bytes);
}

const std::string& Tokenizer::TokenToPiece(int32_t id) const {
  static const std::string* const kEmpty = new std::string();
  return InRange(id) ? pieces_[id] : *kEmpty;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view text) const {
  const auto it = token_to_id_.find(AbslView(text));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kvserve::models
