// MaskWorker (engine/runner/mask_worker.h): masks filled on its thread equal
// those computed on the caller's, step after step, and a worker with
// nothing to do returns at once. On the default model's vocabulary; the
// TSan build checks the hand-over. ~0.3 s.
#include "engine/runner/mask_worker.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar_compiler.h"
#include "grammar/grammar_state.h"
#include "gtest/gtest.h"
#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::engine {
namespace {

TEST(MaskWorkerTest, FillsTheSameMasksAsTheCaller) {
  auto file = models::GgufFile::Open(std::string(KVSERVE_WEIGHTS_DIR) +
                                     "/SmolLM2-135M-Instruct.Q4_1.gguf");
  if (!file.ok()) GTEST_SKIP() << file.status();
  auto data = models::TokenizerDataFromGguf(**file);
  ASSERT_TRUE(data.ok());
  auto tok = models::Tokenizer::Create(*std::move(data));
  ASSERT_TRUE(tok.ok());
  const int32_t vocab = (*tok)->vocab_size();
  auto compiler = grammar::GrammarCompiler::Create(**tok, vocab, {});
  ASSERT_TRUE(compiler.ok());
  auto g = (*compiler)->Compile(
      {grammar::GrammarKind::kJsonSchema,
       R"({"type": "object", "properties": {"a": {"type": "integer"},
           "b": {"type": "array", "items": {"type": "string"}}},
           "required": ["a", "b"], "additionalProperties": false})",
       {},
       "schema"});
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<int32_t> doc =
      (*tok)->Encode(R"({"a": 12, "b": ["x", "yz"]})", false, false);
  // Two sets of states walking the same document: one filled by the
  // worker, one inline.
  std::vector<std::unique_ptr<grammar::GrammarState>> worked, inline_;
  for (int i = 0; i < 4; ++i) {
    worked.push_back(*grammar::GrammarState::Create(*g, {}));
    inline_.push_back(*grammar::GrammarState::Create(*g, {}));
  }
  MaskWorker worker;
  worker.Wait();  // nothing started: returns at once
  std::vector<float> a(vocab), b(vocab);
  for (size_t step = 0; step < doc.size(); ++step) {
    std::vector<grammar::GrammarState*> states;
    for (auto& s : worked) states.push_back(s.get());
    worker.Start(states);
    worker.Wait();
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(worked[i]->mask_ready()) << step;
      ASSERT_FALSE(inline_[i]->mask_ready()) << step;
      std::fill(a.begin(), a.end(), 0.0f);
      std::fill(b.begin(), b.end(), 0.0f);
      ASSERT_EQ(worked[i]->MaskLogits(absl::MakeSpan(a)),
                inline_[i]->MaskLogits(absl::MakeSpan(b)));
      for (int32_t t = 0; t < vocab; ++t) {
        ASSERT_EQ(std::isfinite(a[t]), std::isfinite(b[t])) << step << " " << t;
      }
      ASSERT_TRUE(std::isfinite(a[doc[step]]));
      ASSERT_TRUE(worked[i]->Accept(doc[step]));
      ASSERT_TRUE(inline_[i]->Accept(doc[step]));
    }
  }
  EXPECT_TRUE(worked[0]->completed());
}

}  // namespace
}  // namespace kvserve::engine
