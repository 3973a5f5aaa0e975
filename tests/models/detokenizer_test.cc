// Incremental detokenizer tests: characters split across byte tokens are
// held until complete, deltas are always valid UTF-8, and the stream equals
// Tokenizer::Decode on the real SmolLM2 vocab and a small SentencePiece BPE.
#include "models/tokenizer/detokenizer.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"
#include "models/tokenizer/tokenizer_json.h"
#include "models/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace kvserve::models {
namespace {

using json = nlohmann::json;

const std::string kDataDir =
    std::string(KVSERVE_SOURCE_DIR) + "/tests/data/tokenizer/";
const std::string kSmolLm2Path =
    std::string(KVSERVE_WEIGHTS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kFffd[] = "\xEF\xBF\xBD";

std::unique_ptr<Tokenizer> SmolLm2() {
  auto file = GgufFile::Open(kSmolLm2Path);
  if (!file.ok()) return nullptr;
  auto data = TokenizerDataFromGguf(**file);
  EXPECT_TRUE(data.ok()) << data.status();
  auto tok = Tokenizer::Create(*std::move(data));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::unique_ptr<Tokenizer> SmallSpm() {
  auto data = ReadTokenizerJson(kDataDir + "spm_small_tokenizer.json");
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return nullptr;
  auto tok = Tokenizer::Create(*std::move(data));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

bool IsValidUtf8(const std::string& s) { return SanitizeUtf8(s) == s; }

// Feeds `ids` one by one; returns the deltas (Flush's output last).
std::vector<std::string> Stream(const Tokenizer& tok,
                                const std::vector<int32_t>& ids,
                                DetokenizerOptions options) {
  Detokenizer detok(&tok, options);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(detok.Add(id));
  deltas.push_back(detok.Flush());
  return deltas;
}

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += p;
  return out;
}

TEST(DetokenizerTest, ZwjEmojiSplitAcrossByteTokens) {
  auto tok = SmolLm2();
  if (tok == nullptr) GTEST_SKIP() << "no " << kSmolLm2Path;
  const std::string text = "family: 👨‍👩‍👧‍👦 done";
  const std::vector<int32_t> ids = tok->Encode(text, false, false);
  Detokenizer detok(tok.get());
  std::string out;
  int held = 0;
  for (int32_t id : ids) {
    const std::string delta = detok.Add(id);
    EXPECT_TRUE(IsValidUtf8(delta)) << "id " << id;
    if (detok.pending_bytes() > 0) ++held;
    out += delta;
  }
  EXPECT_GT(held, 0) << "the emoji should span several byte tokens";
  EXPECT_EQ(detok.Flush(), "");
  EXPECT_EQ(out, text);
}

TEST(DetokenizerTest, StreamEqualsDecodeOnGoldenCorpus) {
  auto tok = SmolLm2();
  if (tok == nullptr) GTEST_SKIP() << "no " << kSmolLm2Path;
  std::ifstream in(kDataDir + "smollm2_golden.json");
  std::stringstream buf;
  buf << in.rdbuf();
  const json golden = json::parse(buf.str(), nullptr, false);
  ASSERT_FALSE(golden.is_discarded());
  for (const json& c : golden["cases"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    for (bool skip : {true, false}) {
      const std::vector<std::string> deltas =
          Stream(*tok, ids, {.skip_special = skip, .sequence_start = true});
      for (const std::string& d : deltas) EXPECT_TRUE(IsValidUtf8(d));
      EXPECT_EQ(Join(deltas), tok->Decode(ids, skip)) << c["text"];
    }
  }
}

TEST(DetokenizerTest, SkipSpecialDropsControlTokens) {
  auto tok = SmolLm2();
  if (tok == nullptr) GTEST_SKIP() << "no " << kSmolLm2Path;
  const std::vector<int32_t> ids =
      tok->Encode("Hi there<|im_end|>", false, true);
  EXPECT_EQ(Join(Stream(*tok, ids, {.skip_special = true})), "Hi there");
  EXPECT_EQ(Join(Stream(*tok, ids, {.skip_special = false})),
            "Hi there<|im_end|>");
}

TEST(DetokenizerTest, IncompleteTailFlushesAsReplacementChar) {
  auto tok = SmolLm2();
  if (tok == nullptr) GTEST_SKIP() << "no " << kSmolLm2Path;
  std::vector<int32_t> ids = tok->Encode("🍕", false, false);
  ASSERT_GE(ids.size(), 2u);
  ids.pop_back();
  Detokenizer detok(tok.get());
  for (int32_t id : ids) EXPECT_EQ(detok.Add(id), "");
  EXPECT_GT(detok.pending_bytes(), 0u);
  EXPECT_EQ(detok.Flush(), kFffd);
  EXPECT_EQ(detok.pending_bytes(), 0u);
  EXPECT_EQ(detok.Flush(), "");
}

TEST(DetokenizerTest, InvalidBytesAreReplacedImmediately) {
  auto tok = SmolLm2();
  if (tok == nullptr) GTEST_SKIP() << "no " << kSmolLm2Path;
  // 0xE4 starts a 3-byte character; "x" proves it never completes.
  const std::vector<int32_t> lead = tok->Encode("\xE4", false, false);
  const std::vector<int32_t> x = tok->Encode("x", false, false);
  ASSERT_EQ(lead.size(), 1u);
  ASSERT_EQ(x.size(), 1u);
  Detokenizer detok(tok.get());
  EXPECT_EQ(detok.Add(lead[0]), "");
  EXPECT_EQ(detok.Add(x[0]), std::string(kFffd) + "x");
  EXPECT_EQ(detok.Add(-7), "");  // Out of range: ignored.
  EXPECT_EQ(detok.Add(1 << 30), "");
  EXPECT_EQ(detok.Flush(), "");
}

TEST(DetokenizerTest, SentencePieceByteFallbackAndLeadingSpace) {
  auto tok = SmallSpm();
  ASSERT_NE(tok, nullptr);
  const std::string text = "Hello 🎉 world";
  const std::vector<int32_t> ids = tok->Encode(text, true, false);
  // The emoji is not in the small vocab: four <0xNN> tokens.
  int byte_tokens = 0;
  for (int32_t id : ids)
    byte_tokens +=
        tok->TokenToPiece(id).size() == 1 && (tok->TokenToPiece(id)[0] & 0x80);
  EXPECT_EQ(byte_tokens, 4);
  const std::vector<std::string> deltas =
      Stream(*tok, ids, {.skip_special = true, .sequence_start = true});
  for (const std::string& d : deltas) EXPECT_TRUE(IsValidUtf8(d));
  EXPECT_EQ(Join(deltas), text);
  EXPECT_EQ(Join(deltas), tok->Decode(ids, true));
  // A continuation after a prompt keeps the "▁" of its first token.
  const std::vector<int32_t> word = tok->Encode("world", false, false);
  EXPECT_EQ(Join(Stream(*tok, word, {})), " world");
  EXPECT_EQ(Join(Stream(*tok, word, {.sequence_start = true})), "world");
}

}  // namespace
}  // namespace kvserve::models
