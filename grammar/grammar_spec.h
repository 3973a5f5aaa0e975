// GrammarSpec: what a request asks its output to match, as the server hands
// it to the grammar compiler (grammar/grammar_compiler.h), free of the API
// that carried it (OpenAI response_format, vLLM structured_outputs and
// guided_*, the gRPC proto).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvserve::grammar {

enum class GrammarKind : uint8_t {
  kJsonObject,     // any JSON object (response_format json_object)
  kJsonSchema,     // `source`: a JSON schema document
  kRegex,          // `source`: a regular expression (the whole output)
  kChoice,         // exactly one of `choices`
  kEbnf,           // `source`: XGrammar's EBNF (GBNF-like), rule `root`
  kStructuralTag,  // `source`: XGrammar's structural tag JSON (tool calls)
};

// The API's name of a kind ("json_schema", "regex", ...), for errors and
// metric labels.
[[nodiscard]] const char* GrammarKindName(GrammarKind kind);

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonObject;
  std::string source;
  std::vector<std::string> choices;
  // The request field that carried it ("response_format.json_schema",
  // "structured_outputs.regex", ...): errors name it.
  std::string field;

  // The cache key: equal keys compile to the same grammar.
  [[nodiscard]] std::string Key() const;
};

}  // namespace kvserve::grammar
