// What grammar/'s files share of XGrammar: the CompiledGrammar's insides and
// the exception boundary. Included only by grammar/*.cc (XGrammar's headers
// are this room's private dependency).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grammar/grammar_compiler.h"
#include "xgrammar/xgrammar.h"

namespace kvserve::grammar {

struct CompiledGrammar::Impl {
  xgrammar::CompiledGrammar compiled;
  GrammarKind kind;
  int64_t bytes;
  int32_t vocab_size;            // the logits width masks cover
  std::vector<int32_t> eog_ids;  // the model's end-of-generation tokens
};

// XGrammar reports errors by throwing (std::runtime_error and its
// XGrammarError family); `what` says which call failed.
inline absl::Status FromException(const std::string& what,
                                  const std::exception& e) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", e.what()));
}

}  // namespace kvserve::grammar
