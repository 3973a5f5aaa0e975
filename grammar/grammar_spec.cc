// GrammarSpec's names and cache key. See grammar_spec.h.
#include "grammar/grammar_spec.h"

#include "absl/strings/str_cat.h"

namespace kvserve::grammar {

const char* GrammarKindName(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonObject:
      return "json_object";
    case GrammarKind::kJsonSchema:
      return "json_schema";
    case GrammarKind::kRegex:
      return "regex";
    case GrammarKind::kChoice:
      return "choice";
    case GrammarKind::kEbnf:
      return "grammar";
    case GrammarKind::kStructuralTag:
      return "structural_tag";
  }
  return "unknown";
}

std::string GrammarSpec::Key() const {
  // Length-prefixed parts: no two specs share a key.
  std::string key =
      absl::StrCat(static_cast<int>(kind), ":", source.size(), ":", source);
  for (const std::string& c : choices)
    absl::StrAppend(&key, "|", c.size(), ":", c);
  return key;
}

}  // namespace kvserve::grammar
