// Stop conditions and held-back text, with the default model's tokenizer.
#include "engine/output_processor.h"

#include <vector>

#include "gtest/gtest.h"
#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"

namespace kvserve::engine {
namespace {

std::unique_ptr<models::Tokenizer> LoadTokenizer() {
  auto file = models::GgufFile::Open(
      KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_TRUE(file.ok()) << file.status();
  auto data = models::TokenizerDataFromGguf(**file);
  EXPECT_TRUE(data.ok()) << data.status();
  auto tok = models::Tokenizer::Create(*std::move(data));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

// Feeds `text`'s tokens; returns the emitted text and whether it stopped.
std::pair<std::string, bool> Feed(const models::Tokenizer& tok,
                                  const RequestSpec& spec,
                                  const std::string& text) {
  OutputProcessor out(spec, &tok);
  std::string emitted;
  for (int32_t id : tok.Encode(text, false, false)) {
    OutputProcessor::Step s = out.Accept(id);
    emitted += s.text;
    if (s.stop) return {emitted, true};
  }
  return {emitted + out.Flush(), false};
}

TEST(OutputProcessorTest, StopStringEndsOutputBeforeIt) {
  auto tok = LoadTokenizer();
  RequestSpec spec;
  spec.stop = {"STOP"};
  auto [text, stopped] = Feed(*tok, spec, "Hello world. STOP and more");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(text, "Hello world. ");
}

TEST(OutputProcessorTest, NoStopEmitsEverythingIncludingHeldBackTail) {
  auto tok = LoadTokenizer();
  RequestSpec spec;
  spec.stop = {"never appears"};
  auto [text, stopped] = Feed(*tok, spec, "caf\xc3\xa9 \xf0\x9f\x98\x80 ok");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(text, "caf\xc3\xa9 \xf0\x9f\x98\x80 ok");
}

TEST(OutputProcessorTest, EosAndStopTokenIdsStopWithoutText) {
  auto tok = LoadTokenizer();
  RequestSpec spec;
  OutputProcessor out(spec, tok.get());
  EXPECT_TRUE(out.Accept(tok->eos_id()).stop);
  RequestSpec ignore;
  ignore.ignore_eos = true;
  OutputProcessor out2(ignore, tok.get());
  EXPECT_FALSE(out2.Accept(tok->eos_id()).stop);
  RequestSpec ids;
  ids.stop_token_ids = {42};
  OutputProcessor out3(ids, tok.get());
  OutputProcessor::Step s = out3.Accept(42);
  EXPECT_TRUE(s.stop);
  EXPECT_EQ(s.text, "");
}

}  // namespace
}  // namespace kvserve::engine
