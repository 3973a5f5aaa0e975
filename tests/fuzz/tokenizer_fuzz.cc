// Fuzzes the default model's tokenizer (byte-level BPE) on random bytes:
// Encode never fails and yields in-range ids, Decode of random ids never
// crashes, and for valid UTF-8 without parse_special, Decode(Encode(s)) == s
// minus the bytes that have no byte token in the vocab (Encode drops them,
// as llama.cpp does: SmolLM2 lacks 21 bytes, among them the control
// characters 0x04 0x06 0x13 0x14 0x16 0x1d and the lead byte 0xf2), made
// valid UTF-8 again the way Decode does (found by this fuzzer: a dropped
// lead byte leaves continuation bytes that Decode turns into U+FFFD).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "models/tokenizer/utf8.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// has_byte[b]: some token's raw bytes are exactly the single byte b.
const std::array<bool, 256>& ByteTokens(const kvserve::models::Tokenizer& t) {
  static const std::array<bool, 256> has_byte = [&t] {
    std::array<bool, 256> has{};
    for (int32_t id = 0; id < t.vocab_size(); ++id) {
      if (t.IsSpecial(id)) continue;
      const std::string& piece = t.TokenToPiece(id);
      if (piece.size() == 1) has[static_cast<uint8_t>(piece[0])] = true;
    }
    return has;
  }();
  return has_byte;
}

}  // namespace
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kvserve::models::Tokenizer& tok = kvserve::fuzz::DefaultTokenizer();
  std::string_view text(reinterpret_cast<const char*>(data), size);

  std::vector<int32_t> ids =
      tok.Encode(text, /*add_special=*/false, /*parse_special=*/false);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  }
  // Valid UTF-8 is exactly what SanitizeUtf8 leaves unchanged.
  if (kvserve::models::SanitizeUtf8(text) == text) {
    std::string kept;
    for (char c : text) {
      if (ByteTokens(tok)[static_cast<uint8_t>(c)]) kept.push_back(c);
    }
    // A dropped lead byte (0xF2 has no byte token either) orphans its
    // continuation bytes; Decode returns valid UTF-8, with U+FFFD for them.
    const std::string expected = kvserve::models::SanitizeUtf8(kept);
    std::string back = tok.Decode(ids, /*skip_special=*/false);
    if (back != expected) {
      std::fprintf(stderr,
                   "round trip: %zu bytes in, %zu bytes out; ids:", text.size(),
                   back.size());
      for (int32_t id : ids) {
        std::fprintf(stderr, " %d[", id);
        for (unsigned char c : tok.TokenToPiece(id)) {
          std::fprintf(stderr, "%02x", c);
        }
        std::fprintf(stderr, "]");
      }
      std::fprintf(stderr, "\n");
      __builtin_trap();
    }
  }
  // Control tokens parsed, BOS/EOS added: still in range.
  for (int32_t id : tok.Encode(text, true, true)) {
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  }

  // The same bytes as token ids (4 bytes each; out of range included).
  std::vector<int32_t> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  (void)tok.Decode(raw, /*skip_special=*/false);
  (void)tok.Decode(raw, /*skip_special=*/true);
  for (int32_t id : raw) (void)tok.TokenToPiece(id);
  return 0;
}
