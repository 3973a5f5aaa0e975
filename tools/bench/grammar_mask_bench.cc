// Structured output's per-token cost on the engine thread: GrammarState's
// MaskLogits (XGrammar fills the next-token bitmask, then the row's
// disallowed logits become -inf) and Accept, on the default model's real
// 49,152-token vocabulary, walking the tokens of JSON documents that match
// their schemas, as a constrained decode does. Printed per token: p50, p90,
// p99 and mean over every step of every walk, beside the same run's
// unconstrained sampling of a 49K row (engine::Sample, greedy and
// temperature 1) as the baseline a constrained token adds to.
//
//   build/tools/grammar_mask_bench [--walks N] [--model GGUF]
//
// docs/PERFORMANCE.md holds the measured table; the target there is a mask
// of at most 50 us per token per sequence (p50).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/runner/sampler.h"
#include "grammar/grammar_compiler.h"
#include "grammar/grammar_state.h"
#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"
#include "models/tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvserve::grammar::GrammarKind;
using kvserve::grammar::GrammarSpec;

struct Doc {
  const char* name;
  const char* schema;
  const char* text;
};

const Doc kDocs[] = {
    {"person",
     R"({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"], "additionalProperties": false})",
     R"({"name": "Adele Cooper", "age": 33, "city": "South Africa"})"},
    {"order",
     R"({"type": "object", "properties": {"id": {"type": "integer"},
        "status": {"type": "string", "enum": ["draft", "paid", "shipped"]},
        "items": {"type": "array", "items": {"type": "object", "properties":
          {"sku": {"type": "string"}, "qty": {"type": "integer"},
           "price": {"type": "number"}}, "required": ["sku", "qty", "price"],
          "additionalProperties": false}},
        "note": {"type": ["string", "null"]}},
        "required": ["id", "status", "items", "note"],
        "additionalProperties": false})",
     R"({"id": 1042, "status": "paid", "items": [{"sku": "A-17", "qty": 2, "price": 9.5}, {"sku": "B-3", "qty": 1, "price": 120.25}], "note": null})"},
    {"text",
     R"({"type": "object", "properties": {"title": {"type": "string"},
        "summary": {"type": "string"}}, "required": ["title", "summary"],
        "additionalProperties": false})",
     R"({"title": "On the cost of constraints", "summary": "Masking a vocabulary of forty-nine thousand tokens at every step costs little when the grammar engine precomputes which tokens each state can take, and most of the remaining work is a walk over the few tokens whose validity depends on the stack."})"},
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

void Report(const char* what, const std::vector<double>& us) {
  double sum = 0;
  for (double x : us) sum += x;
  std::printf("%-34s %8zu %8.1f %8.1f %8.1f %8.1f\n", what, us.size(),
              Percentile(us, 0.5), Percentile(us, 0.9), Percentile(us, 0.99),
              sum / static_cast<double>(us.size()));
}

double Micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = std::string(KVSERVE_WEIGHTS_DIR_DEFAULT) +
                      "/SmolLM2-135M-Instruct.Q4_1.gguf";
  int walks = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--walks") == 0) walks = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--model") == 0) model = argv[i + 1];
  }
  auto file = kvserve::models::GgufFile::Open(model);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return 1;
  }
  auto data = kvserve::models::TokenizerDataFromGguf(**file);
  auto tok = kvserve::models::Tokenizer::Create(*std::move(data));
  if (!tok.ok()) return 1;
  const int32_t vocab = (*tok)->vocab_size();
  auto compiler = kvserve::grammar::GrammarCompiler::Create(**tok, vocab, {});
  if (!compiler.ok()) return 1;
  std::printf("vocabulary %d tokens; %d walks per document\n", vocab, walks);
  std::printf("%-34s %8s %8s %8s %8s %8s\n", "per token (us)", "n", "p50",
              "p90", "p99", "mean");
  std::vector<double> all_mask;
  std::vector<float> row(vocab);
  for (const Doc& d : kDocs) {
    auto g = (*compiler)->Compile(
        GrammarSpec{GrammarKind::kJsonSchema, d.schema, {}, "schema"});
    if (!g.ok()) {
      std::fprintf(stderr, "%s: %s\n", d.name, g.status().ToString().c_str());
      return 1;
    }
    const std::vector<int32_t> ids = (*tok)->Encode(d.text, false, false);
    std::vector<double> mask;
    for (int w = 0; w < walks; ++w) {
      auto state = kvserve::grammar::GrammarState::Create(*g, {});
      if (!state.ok()) return 1;
      for (int32_t id : ids) {
        std::fill(row.begin(), row.end(), 0.0f);
        const auto t0 = Clock::now();
        (*state)->MaskLogits(absl::MakeSpan(row));
        const bool ok = (*state)->Accept(id);
        mask.push_back(Micros(t0, Clock::now()));
        if (!ok) {
          std::fprintf(stderr, "%s: token %d refused\n", d.name, id);
          return 1;
        }
      }
    }
    Report((std::string("mask + accept, ") + d.name).c_str(), mask);
    all_mask.insert(all_mask.end(), mask.begin(), mask.end());
  }
  Report("mask + accept, all", all_mask);
  // The baseline: unconstrained sampling of the same width.
  for (const float temperature : {0.0f, 1.0f}) {
    kvserve::engine::SamplingParams p;
    p.temperature = temperature;
    kvserve::engine::SamplerState s(1, false);
    std::vector<double> sample;
    for (size_t i = 0; i < all_mask.size(); ++i) {
      for (int32_t v = 0; v < vocab; ++v) {
        row[v] = static_cast<float>((v * 7919 + i * 104729) % 1000) * 0.01f;
      }
      const auto t0 = Clock::now();
      (void)kvserve::engine::Sample(absl::MakeSpan(row), p, {}, s);
      sample.push_back(Micros(t0, Clock::now()));
    }
    Report(temperature == 0 ? "sample (baseline), greedy"
                            : "sample (baseline), temperature 1",
           sample);
  }
  return 0;
}
