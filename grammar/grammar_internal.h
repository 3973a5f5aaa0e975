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
// Its messages begin with a time and a source location ("[11:07:17]
// /path/json_schema_converter.cc:5082: Unsupported type"): the reason
// alone goes to the client.
inline absl::Status FromException(const std::string& what,
                                  const std::exception& e) {
  std::string reason = e.what();
  if (!reason.empty() && reason[0] == '[') {
    const size_t stamp = reason.find("] ");
    const size_t loc = stamp == std::string::npos
                           ? std::string::npos
                           : reason.find(": ", stamp + 2);
    if (loc != std::string::npos) reason = reason.substr(loc + 2);
  }
  while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) {
    reason.pop_back();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", reason));
}

}  // namespace kvserve::grammar
