// Proto -> engine conversion of client requests, with validation of the
// wire fields. Owns the request limits (RequestLimits), the defaults of
// unset fields (vLLM's: temperature 1, top_p 1, top_k 0 = off, max_tokens
// 16 for a prompt and the rest of the context for chat, random seed), prompt
// tokenization, and chat rendering. Every rejection is INVALID_ARGUMENT, a
// field error (common/field_error.h) naming the proto field's path and its
// limit, e.g. "sampling.top_p: must be in (0, 1], got 1.5". Does not own
// deadlines (the RPC layer sets RequestSpec.deadline) nor the spec's own
// limits (the context, the vocabulary, n, the KV pool): Engine::Submit checks
// those once for every caller, naming RequestSpec paths, and
// ToProtoFieldNames maps them to the proto's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/engine.h"
#include "engine/request_spec.h"
#include "grammar/grammar_compiler.h"
#include "kvserve/v1/kvserve.pb.h"
#include "models/model_config.h"
#include "models/tokenizer/tokenizer.h"
#include "server/tenants.h"

namespace kvserve::server {

// Limits beyond the model's own.
struct RequestLimits {
  int32_t max_stop_strings = 16;
  int32_t max_stop_string_bytes = 256;
  int32_t max_stop_token_ids = 16;
  int32_t max_logprobs = 20;
  int32_t max_request_id_bytes = 256;
  int32_t max_chat_messages = 1024;
  float max_temperature = 100.0f;
  float max_repetition_penalty = 10.0f;
  float max_abs_presence_frequency_penalty = 2.0f;
  // Operator limits (kvserve serve --max-prompt-tokens, --max-tokens-limit)
  // below the model's context; 0: none. An unset max_tokens defaults to at
  // most max_tokens.
  int32_t max_prompt_tokens = 0;
  int32_t max_tokens = 0;
  // Control tokens typed in chat messages ("<|im_end|>") are parsed as such
  // (--special-tokens-in-chat-content); off: they are plain text, so a user
  // cannot forge a turn.
  bool special_tokens_in_chat_content = false;
  // Per API call (one prompt or a batch), beside each tenant's own caps
  // (server/tenants.h): completions, n summed over the prompts (0: none);
  // work, prompt + n x max_tokens summed (0: none).
  int32_t max_completions = 0;
  int64_t max_request_tokens = 0;
  // What a non-streamed HTTP response may hold in memory, estimated from n,
  // max_tokens and logprobs (0: no limit); past it the client must stream.
  int64_t max_response_bytes = 0;
  // kv_policy of a request that sets none (--kv-policy; default full).
  scheduler::KvWindow default_kv_window;
};

// What validation needs to know about the served model.
struct ServedModel {
  const models::Tokenizer* tokenizer = nullptr;  // not owned, non-null
  models::ChatFormat chat_format = models::ChatFormat::kNone;
  std::string chat_template;
  // The longest sequence (prompt + generated) a request may reach.
  int32_t max_context = 0;
  // Tokens one request may hold in the KV pool (its blocks less the
  // watermark); an unset chat max_tokens stays within it (0: the context).
  int64_t max_pool_tokens = 0;
  // Compiles a structured-output grammar (Engine::CompileGrammar); unset:
  // requests with one are FAILED_PRECONDITION.
  std::function<absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>>(
      const grammar::GrammarSpec&)>
      compile_grammar;
};

// Validates `request` and builds the engine's spec: tokenizes the prompt
// (text: parse_special off; chat: rendered with the model's chat format,
// the template's control tokens parsed), applies defaults, and takes
// `seed_if_unset` as the seed when the request has none; compiles its
// structured output last (model.compile_grammar: cached, bounded; its
// errors name "structured_output.<kind>"). Thread-safe.
[[nodiscard]] absl::StatusOr<engine::RequestSpec> ToRequestSpec(
    const v1::GenerateRequest& request, const ServedModel& model,
    uint64_t seed_if_unset, const RequestLimits& limits = {});

// Applies `tenant`'s policy to the specs of one API call (one per prompt):
// priorities clamped to its range, its name, weight, caps and cache scope;
// then the call's caps: INVALID_ARGUMENT naming "n" when its completions
// pass limits.max_completions, "max_tokens" when its work (prompt + n x
// max_tokens, summed) passes the tenant's max_request_tokens or the
// server's: field errors with RequestSpec paths, as Engine::Submit's.
[[nodiscard]] absl::Status ApplyTenant(const Tenant& tenant,
                                       const RequestLimits& limits,
                                       std::vector<engine::RequestSpec>* specs);

// The field error of Engine::Submit or ApplyTenant, whose paths are the
// RequestSpec's ("max_tokens", "stop_token_ids[i]", "prompt_token_ids[i]"),
// naming the proto's paths instead ("sampling.max_tokens", ...), as the
// front ends render them. Other statuses pass unchanged.
[[nodiscard]] absl::Status ToProtoFieldNames(const absl::Status& status);

// Token ids of a Tokenize request: its text, or its chat messages rendered
// as a Generate request's are (INVALID_ARGUMENT for both or a bad message).
[[nodiscard]] absl::StatusOr<std::vector<int32_t>> TokenizeText(
    const v1::TokenizeRequest& request, const ServedModel& model,
    const RequestLimits& limits);

// Text of a Detokenize request; every id must be in [0, vocab_size).
[[nodiscard]] absl::StatusOr<std::string> DetokenizeIds(
    const v1::DetokenizeRequest& request, const ServedModel& model);

// OK if every id is in [0, vocab_size); else names `field`[i].
[[nodiscard]] absl::Status CheckTokenIds(absl::Span<const int32_t> ids,
                                         int32_t vocab_size,
                                         const std::string& field);

// True if `s` is well-formed UTF-8.
[[nodiscard]] bool IsValidUtf8(absl::string_view s);

}  // namespace kvserve::server
