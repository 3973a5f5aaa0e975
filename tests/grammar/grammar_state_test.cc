// The grammar room against XGrammar and the default model's real
// vocabulary (49,152 byte-level BPE tokens): masks admit exactly what the
// grammar can continue with, the end-of-generation token ends a complete
// match, forks and rollbacks keep their place, and the compiler's limits,
// cache, deadline and errors. ~1 s (a few schema compiles).
#include "grammar/grammar_state.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grammar/grammar_compiler.h"
#include "gtest/gtest.h"
#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::grammar {
namespace {

using models::GgufFile;
using models::Tokenizer;
using models::TokenizerDataFromGguf;

const std::string kSmolLm2Path =
    std::string(KVSERVE_WEIGHTS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

const Tokenizer* SmolLm2() {
  static const Tokenizer* tok = [] {
    auto file = GgufFile::Open(kSmolLm2Path);
    if (!file.ok()) return static_cast<Tokenizer*>(nullptr);
    auto data = TokenizerDataFromGguf(**file);
    if (!data.ok()) return static_cast<Tokenizer*>(nullptr);
    auto t = Tokenizer::Create(*std::move(data));
    return t.ok() ? t->release() : nullptr;
  }();
  return tok;
}

class GrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tok_ = SmolLm2();
    if (tok_ == nullptr) GTEST_SKIP() << "no " << kSmolLm2Path;
    GrammarCompilerOptions o;
    auto c = GrammarCompiler::Create(*tok_, tok_->vocab_size(), o);
    ASSERT_TRUE(c.ok()) << c.status();
    compiler_ = *std::move(c);
  }

  std::unique_ptr<GrammarState> State(const GrammarSpec& spec) {
    auto g = compiler_->Compile(spec);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return nullptr;
    auto s = GrammarState::Create(*g, {});
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Feeds `text`'s tokens one by one, checking each is allowed by the mask
  // before it is accepted. Returns the number fed before a refusal.
  size_t Feed(GrammarState& s, const std::string& text) {
    const std::vector<int32_t> ids = tok_->Encode(text, false, false);
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!Allowed(s, ids[i])) return i;
      EXPECT_TRUE(s.Accept(ids[i])) << "token " << i << " of " << text;
    }
    return ids.size();
  }

  bool Allowed(GrammarState& s, int32_t token) {
    std::vector<float> row(tok_->vocab_size(), 0.0f);
    s.MaskLogits(absl::MakeSpan(row));
    return std::isfinite(row[token]);
  }

  const Tokenizer* tok_ = nullptr;
  std::unique_ptr<GrammarCompiler> compiler_;
};

GrammarSpec Schema(std::string schema) {
  return GrammarSpec{GrammarKind::kJsonSchema,
                     std::move(schema),
                     {},
                     "response_format.json_schema.schema"};
}

constexpr char kPerson[] = R"({"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"], "additionalProperties": false})";

TEST_F(GrammarTest, SchemaMasksAdmitExactlyTheValidContinuations) {
  auto s = State(Schema(kPerson));
  ASSERT_NE(s, nullptr);
  const std::string valid = R"({"name": "Ada", "age": 36})";
  EXPECT_EQ(Feed(*s, valid), tok_->Encode(valid, false, false).size());
  EXPECT_TRUE(s->completed());
  EXPECT_FALSE(s->terminated());
  // Complete: only the end of generation may follow.
  std::vector<float> row(tok_->vocab_size(), 0.0f);
  const int32_t allowed = s->MaskLogits(absl::MakeSpan(row));
  EXPECT_EQ(allowed, std::count_if(row.begin(), row.end(),
                                   [](float v) { return std::isfinite(v); }));
  for (int32_t id = 0; id < tok_->vocab_size(); ++id) {
    EXPECT_EQ(std::isfinite(row[id]), tok_->IsEog(id)) << id;
  }
  ASSERT_TRUE(s->Accept(tok_->eos_id()));
  EXPECT_TRUE(s->terminated());
}

TEST_F(GrammarTest, InvalidContinuationsAreMaskedAndRefused) {
  auto s = State(Schema(kPerson));
  ASSERT_NE(s, nullptr);
  // A missing required property, a wrong type, an unknown property.
  EXPECT_LT(Feed(*s, R"({"name": "Ada"})"),
            tok_->Encode(R"({"name": "Ada"})", false, false).size());
  auto t = State(Schema(kPerson));
  EXPECT_LT(Feed(*t, R"({"name": 7})"),
            tok_->Encode(R"({"name": 7})", false, false).size());
  // The end of generation is not allowed before the match completes.
  auto u = State(Schema(kPerson));
  EXPECT_FALSE(Allowed(*u, tok_->eos_id()));
  EXPECT_FALSE(u->Accept(tok_->Encode("hello", false, false)[0]));
}

TEST_F(GrammarTest, JsonObjectRegexChoiceAndEbnf) {
  auto obj = State({GrammarKind::kJsonObject, "", {}, "response_format"});
  const std::string any = R"({"x": [1, 2.5, "y"], "z": {"w": null}})";
  EXPECT_EQ(Feed(*obj, any), tok_->Encode(any, false, false).size());
  EXPECT_TRUE(obj->completed());
  auto not_obj = State({GrammarKind::kJsonObject, "", {}, "response_format"});
  EXPECT_EQ(Feed(*not_obj, "[1]"), 0u);

  auto re = State({GrammarKind::kRegex, R"(\d{3}-[a-z]+)", {}, "guided_regex"});
  EXPECT_EQ(Feed(*re, "123-abc"), tok_->Encode("123-abc", false, false).size());
  EXPECT_TRUE(re->completed());

  // Quotes, backslashes and control bytes in choices are literal.
  GrammarSpec choice{GrammarKind::kChoice,
                     "",
                     {"say \"hi\"", "a\\b", "x\ny"},
                     "guided_choice"};
  for (const std::string& c : choice.choices) {
    auto s = State(choice);
    EXPECT_EQ(Feed(*s, c), tok_->Encode(c, false, false).size()) << c;
    EXPECT_TRUE(s->completed()) << c;
  }
  auto other = State(choice);
  EXPECT_LT(Feed(*other, "say hi"),
            tok_->Encode("say hi", false, false).size());

  auto ebnf = State({GrammarKind::kEbnf,
                     R"(root ::= "yes" | "no" ("!" )*)",
                     {},
                     "guided_grammar"});
  EXPECT_EQ(Feed(*ebnf, "no!!"), tok_->Encode("no!!", false, false).size());
}

TEST_F(GrammarTest, ForkAndRollbackKeepTheirPlace) {
  auto s = State(Schema(kPerson));
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> head = tok_->Encode(R"({"name": ")", false, false);
  for (int32_t id : head) ASSERT_TRUE(s->Accept(id));
  auto child = s->Fork();
  // The child goes on alone; the parent is where the fork left it.
  Feed(*child, R"(Bo", "age": 1})");
  EXPECT_TRUE(child->completed());
  EXPECT_FALSE(s->completed());
  const std::vector<int32_t> tail =
      tok_->Encode(R"(Cy", "age": 2})", false, false);
  for (int32_t id : tail) ASSERT_TRUE(s->Accept(id));
  EXPECT_TRUE(s->completed());
  s->Rollback(static_cast<int32_t>(tail.size()));
  EXPECT_FALSE(s->completed());
  EXPECT_EQ(Feed(*s, R"(Di", "age": 3})"),
            tok_->Encode(R"(Di", "age": 3})", false, false).size());
  EXPECT_TRUE(s->completed());
}

TEST_F(GrammarTest, ErrorsNameTheFieldAndTheReason) {
  auto bad_json = compiler_->Compile(Schema("{not json"));
  EXPECT_EQ(bad_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_json.status().ToString(),
              ::testing::HasSubstr(": response_format.json_schema.schema: "));
  auto bad_regex = compiler_->Compile(
      {GrammarKind::kRegex, "(unclosed", {}, "guided_regex"});
  EXPECT_EQ(bad_regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_regex.status().ToString(),
              ::testing::HasSubstr(": guided_regex: "));
  auto bad_ebnf = compiler_->Compile(
      {GrammarKind::kEbnf, "root ::= undefined_rule", {}, "guided_grammar"});
  EXPECT_EQ(bad_ebnf.status().code(), absl::StatusCode::kInvalidArgument);
  auto empty =
      compiler_->Compile({GrammarKind::kChoice, "", {}, "guided_choice"});
  EXPECT_THAT(empty.status().ToString(), ::testing::HasSubstr("choices"));
  auto huge = compiler_->Compile(
      {GrammarKind::kRegex, std::string(70000, 'a'), {}, "guided_regex"});
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().ToString(), ::testing::HasSubstr("limit"));
  EXPECT_EQ(compiler_->stats().refused, 2);
  EXPECT_EQ(compiler_->stats().failures, 3);
}

TEST_F(GrammarTest, RepeatedSchemaCompilesOnce) {
  auto a = compiler_->Compile(Schema(kPerson));
  auto b = compiler_->Compile(Schema(kPerson));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->get(), b->get());
  EXPECT_EQ(compiler_->stats().compiles, 1);
  EXPECT_EQ(compiler_->stats().cache_hits, 1);
  EXPECT_GT(compiler_->stats().cache_bytes, 0);
}

TEST_F(GrammarTest, ACallerStopsWaitingAtTheDeadlineAndTheCompileLands) {
  GrammarCompilerOptions o;
  o.timeout = absl::Microseconds(1);
  o.max_concurrent = 1;
  auto c = GrammarCompiler::Create(*tok_, tok_->vocab_size(), o);
  ASSERT_TRUE(c.ok());
  auto late = (*c)->Compile(Schema(kPerson));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  // Its slot is held until it ends: the cap refuses a second compile.
  auto busy = (*c)->Compile(Schema(R"({"type": "string"})"));
  if ((*c)->stats().compiles == 0) {
    EXPECT_EQ(busy.status().code(), absl::StatusCode::kResourceExhausted);
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while ((*c)->stats().running > 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_TRUE((*c)->Compile(Schema(kPerson)).ok());  // from the cache
  EXPECT_GE((*c)->stats().cache_hits, 1);
}

}  // namespace
}  // namespace kvserve::grammar
