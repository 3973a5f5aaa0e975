#include "models/tokenizer/utf8.h"

#include <cstdint>

namespace kvserve::models {
namespace {

// Continuation-byte range allowed right after `lead` (Unicode Table 3-7),
// and the total length of the character. length 0: `lead` is invalid.
struct LeadInfo {
  size_t length;
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo InfoForLead(uint8_t lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};
  if (lead >= 0xE1 && lead <= 0xEF) return {3, 0x80, 0xBF};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

Utf8SeqInfo ClassifyUtf8(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const LeadInfo info = InfoForLead(byte(pos));
  if (info.length == 0) return {Utf8Seq::kInvalid, 1};
  if (info.length == 1) return {Utf8Seq::kValid, 1};
  for (size_t k = 1; k < info.length; ++k) {
    if (pos + k >= s.size()) return {Utf8Seq::kIncomplete, s.size() - pos};
    const uint8_t b = byte(pos + k);
    const uint8_t lo = k == 1 ? info.second_lo : 0x80;
    const uint8_t hi = k == 1 ? info.second_hi : 0xBF;
    if (b < lo || b > hi) return {Utf8Seq::kInvalid, k};
  }
  return {Utf8Seq::kValid, info.length};
}

size_t AppendCompleteUtf8(std::string_view in, std::string* out) {
  size_t pos = 0;
  size_t run_start = 0;  // start of the current run of valid bytes
  while (pos < in.size()) {
    if (static_cast<uint8_t>(in[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8SeqInfo seq = ClassifyUtf8(in, pos);
    if (seq.kind == Utf8Seq::kValid) {
      pos += seq.length;
      continue;
    }
    out->append(in.substr(run_start, pos - run_start));
    if (seq.kind == Utf8Seq::kIncomplete) return pos;
    out->append(kReplacementChar);
    pos += seq.length;
    run_start = pos;
  }
  out->append(in.substr(run_start));
  return in.size();
}

std::string SanitizeUtf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  const size_t used = AppendCompleteUtf8(in, &out);
  if (used < in.size()) out.append(kReplacementChar);
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace kvserve::models
