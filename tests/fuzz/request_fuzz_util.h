// What the request fuzz targets share: the served model they validate
// against (the default model's tokenizer and chat template, and a real
// structured-output compiler, so fuzzed schemas, regexes and grammars reach
// XGrammar) and the check that a refusal is a client error with a message.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "grammar/grammar_compiler.h"
#include "models/tokenizer/chat_template.h"
#include "server/request_validation.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvserve::fuzz {

// A served model of `context` tokens (and a pool of `pool_tokens`, 0: as
// large as the context), built once per (process, target).
inline server::ServedModel FuzzModel(int32_t context, int64_t pool_tokens) {
  const models::Tokenizer& tok = DefaultTokenizer();
  server::ServedModel m;
  m.tokenizer = &tok;
  m.chat_template = tok.data().chat_template;
  m.chat_format = models::DetectChatFormat(m.chat_template, tok.data());
  m.max_context = context;
  m.max_pool_tokens = pool_tokens;
  static grammar::GrammarCompiler* compiler = [&tok] {
    grammar::GrammarCompilerOptions o;
    o.timeout = absl::Seconds(5);
    auto c = grammar::GrammarCompiler::Create(tok, tok.vocab_size(), o);
    return c.ok() ? c->release() : nullptr;
  }();
  if (compiler != nullptr) {
    m.compile_grammar = [](const grammar::GrammarSpec& spec) {
      return compiler->Compile(spec);
    };
  }
  return m;
}

// Validation refuses with INVALID_ARGUMENT (OUT_OF_RANGE for what cannot
// fit) and a message; a grammar's compile may also run past its deadline
// (DEADLINE_EXCEEDED) or find the compiles at their cap
// (RESOURCE_EXHAUSTED). Anything else is a bug.
inline void CheckRejection(const absl::Status& status) {
  if (status.ok()) return;
  if (status.code() != absl::StatusCode::kInvalidArgument &&
      status.code() != absl::StatusCode::kOutOfRange &&
      status.code() != absl::StatusCode::kDeadlineExceeded &&
      status.code() != absl::StatusCode::kResourceExhausted) {
    __builtin_trap();
  }
  if (status.message().empty()) __builtin_trap();
}

}  // namespace kvserve::fuzz
