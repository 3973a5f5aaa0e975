// Fuzzes the default model's tokenizer (byte-level BPE) on random bytes:
// Encode never fails and yields in-range ids, Decode of random ids never
// crashes, and for valid UTF-8 without parse_special, Decode(Encode(s)) == s.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "models/utf8.h"
#include "tests/fuzz/fuzz_util.h"

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
    std::string back = tok.Decode(ids, /*skip_special=*/false);
    if (back != text) {
      std::fprintf(stderr, "round trip: %zu bytes in, %zu bytes out\n",
                   text.size(), back.size());
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
