#include "server/request_validation.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/field_error.h"
#include "common/status_macros.h"
#include "models/tokenizer/chat_template.h"
#include "models/tokenizer/utf8.h"
#include "server/kv_policy.h"

namespace kvserve::server {
namespace {

constexpr int32_t kDefaultMaxTokens = 16;  // vLLM's default

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return InvalidFieldError(field, what);
}

// `value` within [lo, hi] (NaN fails); `lo_open` makes the low end open.
absl::Status CheckRange(absl::string_view field, float value, float lo,
                        float hi, bool lo_open = false) {
  const bool ok = (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return absl::OkStatus();
  return Invalid(field, absl::StrFormat("must be in %c%g, %g], got %g",
                                        lo_open ? '(' : '[', lo, hi, value));
}

absl::Status CheckUtf8(absl::string_view field, absl::string_view text) {
  if (IsValidUtf8(text)) return absl::OkStatus();
  return Invalid(field, "invalid UTF-8");
}

absl::StatusOr<std::vector<int32_t>> ChatTokens(const v1::ChatMessages& chat,
                                                const ServedModel& model,
                                                const RequestLimits& limits) {
  if (model.chat_format == models::ChatFormat::kNone) {
    return Invalid("chat",
                   "the served model has no chat template; send "
                   "`prompt` or `prompt_token_ids`");
  }
  if (chat.messages().empty()) {
    return Invalid("chat.messages", "must not be empty");
  }
  if (chat.messages_size() > limits.max_chat_messages) {
    return Invalid(
        "chat.messages",
        absl::StrFormat("at most %d messages, got %d", limits.max_chat_messages,
                        chat.messages_size()));
  }
  std::vector<models::ChatMessage> messages;
  messages.reserve(chat.messages_size());
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    const std::string field = absl::StrCat("chat.messages[", i, "]");
    // "developer" is OpenAI's newer name for the system role.
    const bool developer = m.role() == "developer";
    if (m.role() != "system" && m.role() != "user" && m.role() != "assistant" &&
        !developer) {
      return Invalid(absl::StrCat(field, ".role"),
                     absl::StrFormat("must be system, developer, user, or "
                                     "assistant, got '%s'",
                                     absl::CHexEscape(m.role())));
    }
    KV_RETURN_IF_ERROR(CheckUtf8(absl::StrCat(field, ".content"), m.content()));
    messages.push_back({developer ? "system" : m.role(), m.content()});
  }
  absl::StatusOr<models::RenderedChat> rendered = models::RenderChatParts(
      model.chat_format, messages,
      /*add_generation_prompt=*/true, model.chat_template);
  if (!rendered.ok()) {
    // RenderChat names fields relative to the message list, in its
    // message's "messages[i].role: " prefix.
    const absl::string_view msg = rendered.status().message();
    const size_t colon = msg.find(": ");
    if (absl::StartsWith(msg, "messages") && colon != absl::string_view::npos) {
      return Invalid(absl::StrCat("chat.", msg.substr(0, colon)),
                     msg.substr(colon + 2));
    }
    return Invalid("chat", msg);
  }
  // BOS as the tokenizer says; the template's control tokens parsed, those
  // typed in a message's content only when the operator allows it.
  static const std::vector<models::TextRange> kNone;
  return model.tokenizer->Encode(
      rendered->text, /*add_special=*/true, /*parse_special=*/true,
      limits.special_tokens_in_chat_content ? kNone : rendered->content);
}

// Prompt token ids of any input kind, with the input's field name.
absl::StatusOr<std::pair<std::vector<int32_t>, std::string>> PromptTokens(
    const v1::GenerateRequest& req, const ServedModel& model,
    const RequestLimits& limits) {
  const models::Tokenizer& tok = *model.tokenizer;
  switch (req.input_case()) {
    case v1::GenerateRequest::kPrompt: {
      if (req.prompt().empty()) return Invalid("prompt", "must not be empty");
      KV_RETURN_IF_ERROR(CheckUtf8("prompt", req.prompt()));
      const bool add_special =
          !req.has_add_special_tokens() || req.add_special_tokens();
      return std::make_pair(tok.Encode(req.prompt(), add_special,
                                       /*parse_special=*/false),
                            std::string("prompt"));
    }
    case v1::GenerateRequest::kPromptTokenIds: {
      const auto& ids = req.prompt_token_ids().ids();
      if (ids.empty()) return Invalid("prompt_token_ids", "must not be empty");
      return std::make_pair(std::vector<int32_t>(ids.begin(), ids.end()),
                            std::string("prompt_token_ids"));
    }
    case v1::GenerateRequest::kChat: {
      KV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                          ChatTokens(req.chat(), model, limits));
      return std::make_pair(std::move(ids), std::string("chat"));
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  return Invalid("input",
                 "one of prompt, prompt_token_ids, or chat is "
                 "required");
}

absl::Status CheckStops(const v1::SamplingParams& p,
                        const RequestLimits& limits) {
  if (p.stop_size() > limits.max_stop_strings) {
    return Invalid("sampling.stop",
                   absl::StrFormat("at most %d strings, got %d",
                                   limits.max_stop_strings, p.stop_size()));
  }
  for (int i = 0; i < p.stop_size(); ++i) {
    const std::string field = absl::StrCat("sampling.stop[", i, "]");
    const std::string& s = p.stop(i);
    if (s.empty() ||
        static_cast<int64_t>(s.size()) > limits.max_stop_string_bytes) {
      return Invalid(field,
                     absl::StrFormat("must be 1 to %d bytes, got %d",
                                     limits.max_stop_string_bytes, s.size()));
    }
    KV_RETURN_IF_ERROR(CheckUtf8(field, s));
  }
  if (p.stop_token_ids_size() > limits.max_stop_token_ids) {
    return Invalid(
        "sampling.stop_token_ids",
        absl::StrFormat("at most %d ids, got %d", limits.max_stop_token_ids,
                        p.stop_token_ids_size()));
  }
  return absl::OkStatus();
}

absl::Status CheckSampling(const v1::SamplingParams& p,
                           const RequestLimits& limits) {
  if (p.has_temperature()) {
    KV_RETURN_IF_ERROR(CheckRange("sampling.temperature", p.temperature(), 0,
                                  limits.max_temperature));
  }
  if (p.has_top_k() && p.top_k() < 0) {
    return Invalid("sampling.top_k",
                   absl::StrCat("must be >= 0 (0 = off), got ", p.top_k()));
  }
  if (p.has_top_p()) {
    KV_RETURN_IF_ERROR(CheckRange("sampling.top_p", p.top_p(), 0, 1, true));
  }
  if (p.has_min_p()) {
    KV_RETURN_IF_ERROR(CheckRange("sampling.min_p", p.min_p(), 0, 1));
  }
  if (p.has_repetition_penalty()) {
    KV_RETURN_IF_ERROR(CheckRange("sampling.repetition_penalty",
                                  p.repetition_penalty(), 0,
                                  limits.max_repetition_penalty, true));
  }
  const float pen = limits.max_abs_presence_frequency_penalty;
  if (p.has_presence_penalty()) {
    KV_RETURN_IF_ERROR(CheckRange("sampling.presence_penalty",
                                  p.presence_penalty(), -pen, pen));
  }
  if (p.has_frequency_penalty()) {
    KV_RETURN_IF_ERROR(CheckRange("sampling.frequency_penalty",
                                  p.frequency_penalty(), -pen, pen));
  }
  if (p.logprobs() < 0 || p.logprobs() > limits.max_logprobs) {
    return Invalid("sampling.logprobs",
                   absl::StrFormat("must be in [0, %d], got %d",
                                   limits.max_logprobs, p.logprobs()));
  }
  return absl::OkStatus();
}

// max_tokens, or its default for an unset field: the context left after a
// prompt of `prompt_len` (chat, as OpenAI and vLLM), at most
// kDefaultMaxTokens for a plain prompt (OpenAI's completions default); at
// least 1, so that the engine's check names an over-long prompt. The engine
// checks the result against the context.
int32_t MaxTokens(const v1::SamplingParams& p, int32_t prompt_len,
                  const ServedModel& model, bool chat) {
  if (p.has_max_tokens()) return p.max_tokens();
  // A pool smaller than one context still serves a chat: its default stays
  // within what one request can hold.
  int64_t limit = model.max_context;
  if (model.max_pool_tokens > 0) {
    limit = std::min(limit, model.max_pool_tokens);
  }
  const auto room =
      static_cast<int32_t>(std::max<int64_t>(limit - prompt_len, 1));
  return chat ? room : std::min(room, kDefaultMaxTokens);
}

// The operator's limits on prompt length and max_tokens (RequestLimits).
absl::Status CheckOperatorLimits(const v1::SamplingParams& p, size_t prompt_len,
                                 const std::string& input_field,
                                 const RequestLimits& limits) {
  if (limits.max_prompt_tokens > 0 &&
      prompt_len > static_cast<size_t>(limits.max_prompt_tokens)) {
    return Invalid(input_field,
                   absl::StrFormat("%d tokens, over the server's limit of %d "
                                   "prompt tokens",
                                   prompt_len, limits.max_prompt_tokens));
  }
  if (limits.max_tokens > 0 && p.has_max_tokens() &&
      p.max_tokens() > limits.max_tokens) {
    return Invalid("sampling.max_tokens",
                   absl::StrFormat("at most %d (the server's limit), got %d",
                                   limits.max_tokens, p.max_tokens()));
  }
  return absl::OkStatus();
}

engine::SamplingParams ToEngineSampling(const v1::SamplingParams& p,
                                        uint64_t seed_if_unset) {
  engine::SamplingParams s;  // engine defaults are vLLM's
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  s.seed = p.has_seed() ? p.seed() : seed_if_unset;
  s.logprobs = p.logprobs();
  s.min_tokens = p.min_tokens();
  return s;
}

}  // namespace

bool IsValidUtf8(absl::string_view s) {
  const std::string_view v(s.data(), s.size());
  for (size_t pos = 0; pos < v.size();) {
    const models::Utf8SeqInfo info = models::ClassifyUtf8(v, pos);
    if (info.kind != models::Utf8Seq::kValid) return false;
    pos += info.length;
  }
  return true;
}

absl::Status CheckTokenIds(absl::Span<const int32_t> ids, int32_t vocab_size,
                           const std::string& field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrFormat("unknown token id %d (the vocabulary is "
                                     "[0, %d))",
                                     ids[i], vocab_size));
    }
  }
  return absl::OkStatus();
}

namespace {

// The grammar of `so`, compiled; errors name "structured_output.<kind>".
absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>>
CompileStructuredOutput(const v1::StructuredOutput& so,
                        const ServedModel& model) {
  grammar::GrammarSpec g;
  switch (so.kind_case()) {
    case v1::StructuredOutput::kJsonSchema:
      g.kind = grammar::GrammarKind::kJsonSchema;
      g.source = so.json_schema();
      break;
    case v1::StructuredOutput::kJsonObject:
      if (!so.json_object()) {
        return Invalid("structured_output.json_object", "must be true");
      }
      g.kind = grammar::GrammarKind::kJsonObject;
      break;
    case v1::StructuredOutput::kRegex:
      g.kind = grammar::GrammarKind::kRegex;
      g.source = so.regex();
      break;
    case v1::StructuredOutput::kChoice:
      g.kind = grammar::GrammarKind::kChoice;
      g.choices.assign(so.choice().choices().begin(),
                       so.choice().choices().end());
      break;
    case v1::StructuredOutput::kGrammar:
      g.kind = grammar::GrammarKind::kEbnf;
      g.source = so.grammar();
      break;
    case v1::StructuredOutput::kStructuralTag:
      g.kind = grammar::GrammarKind::kStructuralTag;
      g.source = so.structural_tag();
      break;
    case v1::StructuredOutput::KIND_NOT_SET:
      return Invalid("structured_output",
                     "set one of json_schema, json_object, regex, choice, "
                     "grammar, structural_tag");
  }
  g.field = absl::StrCat(
      "structured_output.",
      so.GetDescriptor()->FindFieldByNumber(so.kind_case())->name());
  if (!model.compile_grammar) {
    return FieldError(absl::StatusCode::kFailedPrecondition, g.field,
                      "structured output is not available here");
  }
  auto compiled = model.compile_grammar(g);
  if (!compiled.ok()) {
    // The compiler's "<field>: <reason>", as a field error.
    absl::string_view msg = compiled.status().message();
    absl::ConsumePrefix(&msg, absl::StrCat(g.field, ": "));
    return FieldError(compiled.status().code(), g.field, msg);
  }
  return compiled;
}

}  // namespace

absl::StatusOr<engine::RequestSpec> ToRequestSpec(
    const v1::GenerateRequest& request, const ServedModel& model,
    uint64_t seed_if_unset, const RequestLimits& limits) {
  if (static_cast<int64_t>(request.request_id().size()) >
      limits.max_request_id_bytes) {
    return Invalid("request_id", absl::StrFormat("at most %d bytes, got %d",
                                                 limits.max_request_id_bytes,
                                                 request.request_id().size()));
  }
  KV_RETURN_IF_ERROR(CheckUtf8("request_id", request.request_id()));
  if (static_cast<int64_t>(request.cache_salt().size()) >
      limits.max_request_id_bytes) {
    return Invalid("cache_salt", absl::StrFormat("at most %d bytes, got %d",
                                                 limits.max_request_id_bytes,
                                                 request.cache_salt().size()));
  }
  const v1::SamplingParams& p = request.sampling();
  KV_RETURN_IF_ERROR(CheckSampling(p, limits));
  KV_RETURN_IF_ERROR(CheckStops(p, limits));
  KV_ASSIGN_OR_RETURN(auto prompt, PromptTokens(request, model, limits));
  auto& [tokens, input_field] = prompt;
  KV_RETURN_IF_ERROR(
      CheckOperatorLimits(p, tokens.size(), input_field, limits));
  int32_t max_tokens =
      MaxTokens(p, static_cast<int32_t>(tokens.size()), model,
                request.input_case() == v1::GenerateRequest::kChat);
  if (limits.max_tokens > 0) {
    max_tokens = std::min(max_tokens, limits.max_tokens);
  }
  engine::RequestSpec spec;
  spec.prompt_tokens = std::move(tokens);
  spec.sampling = ToEngineSampling(p, seed_if_unset);
  spec.max_tokens = max_tokens;
  spec.stop.assign(p.stop().begin(), p.stop().end());
  spec.stop_token_ids.assign(p.stop_token_ids().begin(),
                             p.stop_token_ids().end());
  spec.include_stop_str_in_output = p.include_stop_str_in_output();
  spec.skip_special_tokens =
      !p.has_skip_special_tokens() || p.skip_special_tokens();
  spec.ignore_eos = p.ignore_eos();
  spec.priority = request.priority();
  spec.cache_salt = request.cache_salt();
  spec.n = request.n() == 0 ? 1 : request.n();  // 0: unset
  spec.speculate = !request.no_speculation();
  spec.kv_window = limits.default_kv_window;
  if (request.has_kv_policy()) {
    KV_ASSIGN_OR_RETURN(spec.kv_window, ToKvWindow(request.kv_policy()));
  }
  if (request.has_structured_output()) {
    KV_ASSIGN_OR_RETURN(spec.grammar, CompileStructuredOutput(
                                          request.structured_output(), model));
  }
  return spec;
}

absl::Status ApplyTenant(const Tenant& tenant, const RequestLimits& limits,
                         std::vector<engine::RequestSpec>* specs) {
  const TenantLimits& t = tenant.limits;
  int64_t completions = 0;
  int64_t work = 0;
  for (engine::RequestSpec& spec : *specs) {
    spec.priority = std::clamp(spec.priority, t.priority_min, t.priority_max);
    spec.tenant = {.name = tenant.name,
                   .cache_scope = tenant.cache_scope,
                   .scope_shared = tenant.scope_shared,
                   .weight = t.weight,
                   .max_running = t.max_running,
                   .max_queued = t.max_queued};
    completions += spec.n;
    work += static_cast<int64_t>(spec.prompt_tokens.size()) +
            int64_t{spec.n} * spec.max_tokens;
  }
  if (limits.max_completions > 0 && completions > limits.max_completions) {
    return Invalid("n",
                   absl::StrFormat("%d completions in this request (n x "
                                   "prompts), over the server's limit of %d "
                                   "sequences (--max-num-seqs)",
                                   completions, limits.max_completions));
  }
  const bool own = t.max_request_tokens > 0 &&
                   (limits.max_request_tokens <= 0 ||
                    t.max_request_tokens < limits.max_request_tokens);
  const int64_t cap = own ? t.max_request_tokens : limits.max_request_tokens;
  if (cap > 0 && work > cap) {
    return Invalid(
        "max_tokens",
        absl::StrFormat("this request asks for %d tokens (prompt + n x "
                        "max_tokens, over all prompts), over %s limit of %d "
                        "(%s)",
                        work, own ? "its tenant's" : "the server's", cap,
                        own ? "max_request_tokens" : "--max-request-tokens"));
  }
  return absl::OkStatus();
}

absl::Status ToProtoFieldNames(const absl::Status& status) {
  static constexpr FieldRename kSpecToProto[] = {
      {"max_tokens", "sampling.max_tokens"},
      {"min_tokens", "sampling.min_tokens"},
      {"stop_token_ids", "sampling.stop_token_ids"},
      {"prompt_token_ids", "prompt_token_ids.ids"},
  };
  return RenameFieldPath(status, kSpecToProto);
}

absl::StatusOr<std::vector<int32_t>> TokenizeText(
    const v1::TokenizeRequest& request, const ServedModel& model,
    const RequestLimits& limits) {
  if (request.has_chat()) {
    if (!request.text().empty()) {
      return Invalid("chat", "send `text` or `chat`, not both");
    }
    return ChatTokens(request.chat(), model, limits);
  }
  KV_RETURN_IF_ERROR(CheckUtf8("text", request.text()));
  const bool add_special =
      !request.has_add_special_tokens() || request.add_special_tokens();
  return model.tokenizer->Encode(request.text(), add_special,
                                 request.parse_special_tokens());
}

absl::StatusOr<std::string> DetokenizeIds(const v1::DetokenizeRequest& request,
                                          const ServedModel& model) {
  KV_RETURN_IF_ERROR(CheckTokenIds(request.token_ids(),
                                   model.tokenizer->vocab_size(), "token_ids"));
  return model.tokenizer->Decode(request.token_ids(),
                                 request.skip_special_tokens());
}

}  // namespace kvserve::server
