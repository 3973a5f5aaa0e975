#include "server/served_model.h"

namespace kvserve::server {

ServedModel ServedModelOf(const engine::Engine& engine) {
  ServedModel m;
  m.tokenizer = &engine.tokenizer();
  m.chat_format = engine.model().chat_format;
  m.chat_template = engine.model().chat_template;
  m.max_context = engine.model_info().max_context;
  m.max_pool_tokens = engine.model_info().max_request_kv_tokens;
  m.compile_grammar = [&engine](const grammar::GrammarSpec& spec) {
    return engine.CompileGrammar(spec);
  };
  return m;
}

}  // namespace kvserve::server
