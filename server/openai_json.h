// The JSON side of the OpenAI-compatible API: request bodies of
// /v1/completions and /v1/chat/completions parsed (type-checked field by
// field, no exceptions) into a kvserve GenerateRequest, so that the limits
// and defaults of request_validation.h apply unchanged; response bodies and
// server-sent-event chunks in OpenAI's shapes; and the one mapping from
// absl::Status to an HTTP status and OpenAI error body. Does not own HTTP,
// the engine, or validation bounds (request_validation.h does).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/engine.h"
#include "engine/request_spec.h"
#include "kvserve/v1/kvserve.pb.h"
#include "models/tokenizer/tokenizer.h"
#include "server/tool_calls.h"

namespace kvserve::server {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// A parsed request body. Range checks are left to ToRequestSpec.
struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  v1::GenerateRequest generate;  // input and sampling
  // A batch of prompts ("prompt": ["a", "b"] or [[1, 2], [3]]): each its own
  // request, its input only (the rest is `generate`'s); empty: one prompt,
  // in `generate`.
  std::vector<v1::GenerateRequest> batch;
  std::string model;  // empty when not given
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // vLLM's extension: each choice carries its output token ids
  // ("token_ids"; in a stream, those of the chunk).
  bool return_token_ids = false;
  bool logprobs = false;     // report logprobs at all
  int32_t top_logprobs = 0;  // alternatives per token
  // The field the client limited its output with (chat may use
  // "max_completion_tokens"), for the errors about it.
  std::string max_tokens_name = "max_tokens";
  // The body's field that asked for structured output, for the errors of
  // its compile ("response_format.json_schema.schema", "guided_regex").
  std::string structured_output_field;
  // Chat with tools (tool_choice other than "none"): the output is parsed
  // into tool_calls (server/tool_calls.h).
  bool tool_calls = false;
};

// Most prompts in one batched completions request.
inline constexpr int kMaxBatchPrompts = 64;

// Arrays and objects nested deeper than this are refused before parsing.
inline constexpr int kMaxJsonDepth = 64;

// Parses `body`. INVALID_ARGUMENT is a field error (common/field_error.h)
// naming OpenAI's field, for malformed JSON, wrong types, and unsupported
// options (echo, best_of, suffix, logit_bias, tools).
[[nodiscard]] absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(
    absl::string_view body, OpenAiEndpoint endpoint);

// An HTTP error response.
struct HttpError {
  int http_status = 500;
  std::string body;  // {"error": {"message", "type", "param", "code"}}
};

// The single absl::Status -> HTTP mapping: INVALID_ARGUMENT, OUT_OF_RANGE,
// FAILED_PRECONDITION -> 400; UNAUTHENTICATED -> 401; PERMISSION_DENIED ->
// 403; NOT_FOUND -> 404; RESOURCE_EXHAUSTED -> 429; UNAVAILABLE -> 503;
// DEADLINE_EXCEEDED -> 504; anything else -> 500. `param` is the field a
// field error names, else the message's "field: " prefix when there is one.
[[nodiscard]] HttpError ToHttpError(const absl::Status& status);

// What the response writer needs to know about one call.
struct OpenAiCallInfo {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool include_usage = false;
  bool return_token_ids = false;
  bool tool_calls = false;  // OpenAiRequest::tool_calls
};

// The whole output of a finished request (finish_reason kStop or kLength).
struct OpenAiResult {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<engine::TokenLogprobs> logprobs;
  engine::FinishReason finish_reason = engine::FinishReason::kNone;
  engine::Usage usage;
};

// The non-streaming response body.
[[nodiscard]] std::string CompletionBody(const OpenAiCallInfo& call,
                                         const OpenAiResult& result,
                                         const models::Tokenizer& tokenizer);
// With n completions: choice i is results[i]; `usage` covers them all.
[[nodiscard]] std::string CompletionBody(
    const OpenAiCallInfo& call, const std::vector<OpenAiResult>& results,
    const engine::Usage& usage, const models::Tokenizer& tokenizer);

// Server-sent events for one stream delta: "data: {json}\n\n" per chunk,
// each choice carrying the delta's completion index. `first` (the index's
// first delta) adds chat's role chunk; a delta that ends its completion adds
// its finish chunk; the stream's finished delta adds the finish chunk,
// the usage chunk when asked for, and "data: [DONE]\n\n". A finished delta
// whose reason is not stop/length gets an error event (`error`) instead.
// `tools`: with call.tool_calls, the calls this delta closed (its text is
// already the content left around them) and whether the completion made
// any (then a stop finishes as "tool_calls").
struct StreamToolCalls {
  std::vector<ToolCall> calls;
  int32_t first_index = 0;  // of calls[0] among the completion's calls
  bool any = false;
};
[[nodiscard]] std::string StreamEvents(const OpenAiCallInfo& call,
                                       const engine::StreamDelta& delta,
                                       bool first,
                                       const models::Tokenizer& tokenizer,
                                       const absl::Status& error,
                                       const StreamToolCalls& tools = {});

// GET /v1/models.
[[nodiscard]] std::string ModelsBody(const std::string& model, int64_t created,
                                     const engine::ModelInfo& info);

}  // namespace kvserve::server
