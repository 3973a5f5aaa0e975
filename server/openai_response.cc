// Response bodies, stream events, and errors of openai_json.h.
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/field_error.h"
#include "kvcache/kv_format.h"
#include "nlohmann/json.hpp"
#include "server/openai_json.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

std::string Dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

bool IsChat(const OpenAiCallInfo& call) {
  return call.endpoint == OpenAiEndpoint::kChatCompletions;
}

json FinishReasonJson(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
      return "length";
    default:
      return nullptr;
  }
}

// kvserve's extension of `usage`: what the call cost the KV cache.
json KvUsageJson(const engine::KvUsage& kv) {
  return {{"kv_dtype", kv.kv_dtype.has_value()
                           ? std::string(kvcache::KvDtypeName(*kv.kv_dtype))
                           : std::string()},
          {"peak_kv_blocks", kv.peak_blocks},
          {"peak_kv_bytes", kv.peak_bytes},
          {"preemptions",
           {{"recompute", kv.preemptions_recompute},
            {"swap", kv.preemptions_swap}}},
          {"recomputed_tokens", kv.recomputed_tokens},
          {"dropped_tokens", kv.dropped_tokens},
          {"speculative",
           {{"draft_tokens", kv.draft_tokens},
            {"accepted_tokens", kv.accepted_draft_tokens}}},
          {"swapped_out_bytes", kv.swapped_out_bytes},
          {"swapped_in_bytes", kv.swapped_in_bytes},
          {"queued_seconds", kv.queued_seconds},
          {"preempted_seconds", kv.preempted_seconds},
          {"cached_tokens_by_tier",
           {{"device", kv.cached_tokens_device},
            {"host", kv.cached_tokens_host},
            {"disk", kv.cached_tokens_disk},
            {"remote", kv.cached_tokens_remote}}}};
}

json UsageJson(const engine::Usage& u) {
  return {
      {"prompt_tokens", u.prompt_tokens},
      {"completion_tokens", u.completion_tokens},
      {"total_tokens", u.prompt_tokens + u.completion_tokens},
      {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
      {"kvserve", KvUsageJson(u.kv)}};
}

json Bytes(const std::string& piece) {
  json out = json::array();
  for (unsigned char c : piece) out.push_back(static_cast<int>(c));
  return out;
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json ChatLogprobs(const OpenAiCallInfo& call,
                  const std::vector<engine::TokenLogprobs>& lps,
                  const models::Tokenizer& tok) {
  json content = json::array();
  for (const engine::TokenLogprobs& lp : lps) {
    const std::string& piece = tok.TokenToPiece(lp.token);
    json top = json::array();
    for (size_t i = 0;
         i < lp.top.size() && static_cast<int32_t>(i) < call.top_logprobs;
         ++i) {
      const std::string& p = tok.TokenToPiece(lp.top[i].token);
      top.push_back(
          {{"token", p}, {"logprob", lp.top[i].logprob}, {"bytes", Bytes(p)}});
    }
    content.push_back({{"token", piece},
                       {"logprob", lp.logprob},
                       {"bytes", Bytes(piece)},
                       {"top_logprobs", std::move(top)}});
  }
  // OpenAI's schema requires refusal (null: none).
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// Completions (legacy): tokens, token_logprobs, top_logprobs, text_offset.
json CompletionLogprobs(const OpenAiCallInfo& call,
                        const std::vector<engine::TokenLogprobs>& lps,
                        const models::Tokenizer& tok, int64_t* offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (const engine::TokenLogprobs& lp : lps) {
    const std::string& piece = tok.TokenToPiece(lp.token);
    tokens.push_back(piece);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (size_t i = 0;
         i < lp.top.size() && static_cast<int32_t>(i) < call.top_logprobs;
         ++i) {
      top[tok.TokenToPiece(lp.top[i].token)] = lp.top[i].logprob;
    }
    tops.push_back(std::move(top));
    offsets.push_back(*offset);
    *offset += static_cast<int64_t>(piece.size());
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json LogprobsJson(const OpenAiCallInfo& call,
                  const std::vector<engine::TokenLogprobs>& lps,
                  const models::Tokenizer& tok) {
  if (!call.logprobs) return nullptr;
  if (IsChat(call)) return ChatLogprobs(call, lps, tok);
  int64_t offset = 0;
  return CompletionLogprobs(call, lps, tok, &offset);
}

json Envelope(const OpenAiCallInfo& call, bool chunk) {
  const char* object =
      IsChat(call) ? (chunk ? "chat.completion.chunk" : "chat.completion")
                   : "text_completion";
  return {{"id", call.id},
          {"object", object},
          {"created", call.created},
          {"model", call.model}};
}

std::string Event(const json& j) {
  return absl::StrCat("data: ", Dump(j), "\n\n");
}

json ToolCallsJson(const std::vector<ToolCall>& calls, int32_t first_index,
                   bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function",
               {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = first_index + static_cast<int32_t>(i);
    out.push_back(std::move(c));
  }
  return out;
}

// A stop after tool calls finishes as "tool_calls".
json FinishJson(engine::FinishReason r, bool tool_calls) {
  if (tool_calls && r == engine::FinishReason::kStop) return "tool_calls";
  return FinishReasonJson(r);
}

// One chunk with a single choice.
json Chunk(const OpenAiCallInfo& call, json choice) {
  json j = Envelope(call, true);
  j["choices"] = json::array({std::move(choice)});
  if (call.include_usage) j["usage"] = nullptr;
  return j;
}

json DeltaChoice(const OpenAiCallInfo& call, const engine::StreamDelta& d,
                 const models::Tokenizer& tok) {
  json choice = {{"index", d.index},
                 {"logprobs", LogprobsJson(call, d.logprobs, tok)},
                 {"finish_reason", nullptr}};
  if (IsChat(call)) {
    choice["delta"] = {{"content", d.text}, {"refusal", nullptr}};
  } else {
    choice["text"] = d.text;
  }
  if (call.return_token_ids) choice["token_ids"] = d.token_ids;
  return choice;
}

// The finish chunk of completion d.index, and when the stream ends the usage
// chunk (if asked for) and [DONE].
std::string FinalEvents(const OpenAiCallInfo& call,
                        const engine::StreamDelta& d, bool tool_calls) {
  json choice = {{"index", d.index},
                 {"logprobs", nullptr},
                 {"finish_reason", FinishJson(d.finish_reason, tool_calls)}};
  if (IsChat(call)) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  std::string out = Event(Chunk(call, std::move(choice)));
  if (!d.finished) return out;
  if (call.include_usage) {
    json usage = Envelope(call, true);
    usage["choices"] = json::array();
    usage["usage"] = UsageJson(d.usage);
    absl::StrAppend(&out, Event(usage));
  }
  absl::StrAppend(&out, "data: [DONE]\n\n");
  return out;
}

const char* ErrorType(int http_status) {
  switch (http_status) {
    case 400:
    case 404:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return "server_error";
  }
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

// The field a status names (common/field_error.h), else its message's
// "field: " prefix, or null.
json ParamOf(const absl::Status& status) {
  if (std::optional<std::string> field = ErrorField(status)) {
    return *std::move(field);
  }
  const absl::string_view msg = status.message();
  const size_t colon = msg.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return nullptr;
  const absl::string_view field = msg.substr(0, colon);
  if (field.find(' ') != absl::string_view::npos) return nullptr;
  return std::string(field);
}

json ErrorJson(const absl::Status& status) {
  const int http = HttpStatus(status.code());
  json param = ParamOf(status);
  json code = nullptr;
  if (status.code() == absl::StatusCode::kNotFound && param == "model") {
    code = "model_not_found";
  } else if (http == 429) {
    code = "rate_limit_exceeded";
  }
  return {{"error",
           {{"message", std::string(status.message())},
            {"type", ErrorType(http)},
            {"param", std::move(param)},
            {"code", std::move(code)}}}};
}

}  // namespace

HttpError ToHttpError(const absl::Status& status) {
  return {HttpStatus(status.code()), Dump(ErrorJson(status))};
}

std::string CompletionBody(const OpenAiCallInfo& call,
                           const OpenAiResult& result,
                           const models::Tokenizer& tokenizer) {
  return CompletionBody(call, std::vector<OpenAiResult>{result}, result.usage,
                        tokenizer);
}

std::string CompletionBody(const OpenAiCallInfo& call,
                           const std::vector<OpenAiResult>& results,
                           const engine::Usage& usage,
                           const models::Tokenizer& tokenizer) {
  json choices = json::array();
  for (size_t i = 0; i < results.size(); ++i) {
    const OpenAiResult& result = results[i];
    json choice = {{"index", static_cast<int64_t>(i)},
                   {"logprobs", LogprobsJson(call, result.logprobs, tokenizer)},
                   {"finish_reason", FinishReasonJson(result.finish_reason)}};
    if (IsChat(call) && call.tool_calls) {
      ToolCallStream parse(absl::StrCat("call_", call.id, "_", i, "_"));
      ToolCallStream::Out out = parse.Feed(result.text);
      out.content += parse.Finish().content;
      const bool blank =
          out.content.find_first_not_of(" \n") == std::string::npos;
      choice["message"] = {
          {"role", "assistant"},
          {"content",
           blank && !out.calls.empty() ? json(nullptr) : json(out.content)},
          {"refusal", nullptr}};
      if (!out.calls.empty()) {
        choice["message"]["tool_calls"] = ToolCallsJson(out.calls, 0, false);
        choice["finish_reason"] =
            FinishJson(result.finish_reason, /*tool_calls=*/true);
      }
    } else if (IsChat(call)) {
      choice["message"] = {{"role", "assistant"},
                           {"content", result.text},
                           {"refusal", nullptr}};
    } else {
      choice["text"] = result.text;
    }
    if (call.return_token_ids) choice["token_ids"] = result.token_ids;
    choices.push_back(std::move(choice));
  }
  json j = Envelope(call, false);
  j["choices"] = std::move(choices);
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string StreamEvents(const OpenAiCallInfo& call,
                         const engine::StreamDelta& delta, bool first,
                         const models::Tokenizer& tokenizer,
                         const absl::Status& error,
                         const StreamToolCalls& tools) {
  std::string out;
  if (first && IsChat(call)) {
    out = Event(Chunk(
        call, {{"index", delta.index},
               {"delta",
                {{"role", "assistant"}, {"content", ""}, {"refusal", nullptr}}},
               {"logprobs", nullptr},
               {"finish_reason", nullptr}}));
  }
  if (!delta.text.empty() || !delta.logprobs.empty() ||
      (call.return_token_ids && !delta.token_ids.empty())) {
    absl::StrAppend(&out,
                    Event(Chunk(call, DeltaChoice(call, delta, tokenizer))));
  }
  if (!tools.calls.empty()) {  // each call whole, as one delta
    absl::StrAppend(
        &out,
        Event(Chunk(call,
                    {{"index", delta.index},
                     {"delta",
                      {{"tool_calls",
                        ToolCallsJson(tools.calls, tools.first_index, true)}}},
                     {"logprobs", nullptr},
                     {"finish_reason", nullptr}})));
  }
  if (!delta.finished && !delta.index_finished) return out;
  if (delta.finished && !error.ok()) {
    absl::StrAppend(&out, Event(ErrorJson(error)));
    return out;
  }
  absl::StrAppend(&out, FinalEvents(call, delta, tools.any));
  return out;
}

std::string ModelsBody(const std::string& model, int64_t created,
                       const engine::ModelInfo& info) {
  json entry = {{"id", model},
                {"object", "model"},
                {"created", created},
                {"owned_by", "kvserve"},
                {"max_model_len", info.max_context},
                // Extension: the KV cache behind the model.
                {"kvserve",
                 {{"kv_cache_dtype", kvcache::KvDtypeName(info.kv_dtype)},
                  {"kv_bytes_per_token", info.kv_bytes_per_token},
                  {"block_size", info.block_size},
                  {"num_blocks", info.num_blocks},
                  {"device", info.device},
                  {"simulated", info.simulated}}}};
  return Dump({{"object", "list"}, {"data", json::array({std::move(entry)})}});
}

}  // namespace kvserve::server
