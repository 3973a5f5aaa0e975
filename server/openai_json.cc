#include "server/openai_json.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/field_error.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "server/json_field.h"
#include "server/openai_structured.h"
#include "server/tool_calls.h"

namespace kvserve::server {
namespace {

using json = nlohmann::json;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return InvalidFieldError(field, what);
}

// The field, or null when absent (absent and null are the same).
absl::Status GetFloat(const json& body, const char* name,
                      std::optional<float>* out) {
  const json& v = Field(body, name);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_number()) return Invalid(name, "must be a number");
  const double d = v.get<double>();
  float f = static_cast<float>(d);
  // A nonzero value below float's range is its smallest neighbour, not 0
  // (top_p 1e-50 is a valid, tiny top_p); one above it is inf, which the
  // range checks report.
  if (f == 0.0f && d != 0.0) {
    f = std::copysign(std::numeric_limits<float>::denorm_min(),
                      static_cast<float>(d < 0 ? -1 : 1));
  }
  *out = f;
  return absl::OkStatus();
}

// An integer, or a float with an integral value (7.0, as OpenAI's clients
// may send). Values past int64 saturate, so range checks downstream report
// them as too large.
absl::Status GetInt(const json& body, const char* name,
                    std::optional<int64_t>* out) {
  const json& v = Field(body, name);
  if (v.is_null()) return absl::OkStatus();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    *out = u > static_cast<uint64_t>(kMax) ? kMax : static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is exact in a double; anything from it up saturates.
    if (!std::isfinite(d) || d != std::floor(d)) {
      return Invalid(name, "must be an integer");
    }
    *out = d >= 0x1p63   ? kMax
           : d < -0x1p63 ? std::numeric_limits<int64_t>::min()
                         : static_cast<int64_t>(d);
    return absl::OkStatus();
  }
  if (!v.is_number_integer()) return Invalid(name, "must be an integer");
  *out = v.get<int64_t>();
  return absl::OkStatus();
}

// The seed: exactly the proto's uint64 range, [0, 2^64 - 1].
absl::Status GetSeed(const json& body, std::optional<uint64_t>* out) {
  const json& v = Field(body, "seed");
  if (v.is_null()) return absl::OkStatus();
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return absl::OkStatus();
  }
  if (v.is_number_float()) {
    // An integral float in range (1e19) is that integer: exact in a double.
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && d >= 0 && d < 0x1p64) {
      *out = static_cast<uint64_t>(d);
      return absl::OkStatus();
    }
  }
  if (v.is_number_integer() || v.is_number_float()) {
    return Invalid("seed",
                   absl::StrCat("out of range: must be an integer in [0, ",
                                std::numeric_limits<uint64_t>::max(), "], got ",
                                v.dump()));
  }
  return Invalid("seed", "must be an integer");
}

// An int field that must fit int32 (clamped to the limits beyond, so the
// range checks downstream report the value).
absl::Status GetInt32(const json& body, const char* name,
                      std::optional<int32_t>* out) {
  std::optional<int64_t> v;
  KV_RETURN_IF_ERROR(GetInt(body, name, &v));
  if (v.has_value()) {
    if (*v < std::numeric_limits<int32_t>::min() ||
        *v > std::numeric_limits<int32_t>::max()) {
      return Invalid(name, absl::StrCat("out of range, got ", *v));
    }
    *out = static_cast<int32_t>(*v);
  }
  return absl::OkStatus();
}

absl::Status GetBool(const json& body, const char* name, bool* out) {
  const json& v = Field(body, name);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_boolean()) return Invalid(name, "must be a boolean");
  *out = v.get<bool>();
  return absl::OkStatus();
}

absl::Status GetString(const json& body, const char* name, std::string* out) {
  const json& v = Field(body, name);
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_string()) return Invalid(name, "must be a string");
  *out = v.get<std::string>();
  return absl::OkStatus();
}

// Options kvserve does not implement: a clear 400 rather than silence.
absl::Status CheckUnsupported(const json& body) {
  std::optional<int64_t> best_of;
  KV_RETURN_IF_ERROR(GetInt(body, "best_of", &best_of));
  if (best_of.has_value() && *best_of != 1) {
    return Invalid("best_of", "only best_of=1 is supported");
  }
  bool echo = false;
  KV_RETURN_IF_ERROR(GetBool(body, "echo", &echo));
  if (echo) return Invalid("echo", "echo is not supported");
  std::string suffix;
  KV_RETURN_IF_ERROR(GetString(body, "suffix", &suffix));
  if (!suffix.empty()) return Invalid("suffix", "suffix is not supported");
  for (const char* name : {"logit_bias", "functions", "prompt_logprobs"}) {
    const json& v = Field(body, name);
    if (!v.is_null() && !v.empty()) {
      return Invalid(name, absl::StrCat(name, " is not supported"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& body, v1::SamplingParams* p) {
  const json& v = Field(body, "stop");
  if (v.is_null()) return absl::OkStatus();
  if (v.is_string()) {
    p->add_stop(v.get<std::string>());
    return absl::OkStatus();
  }
  if (!v.is_array()) return Invalid("stop", "must be a string or an array");
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) {
      return Invalid(absl::StrCat("stop[", i, "]"), "must be a string");
    }
    p->add_stop(v[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const json& body, OpenAiEndpoint endpoint,
                           v1::SamplingParams* p) {
  std::optional<float> temperature, top_p, min_p, presence, frequency, rep;
  KV_RETURN_IF_ERROR(GetFloat(body, "temperature", &temperature));
  KV_RETURN_IF_ERROR(GetFloat(body, "top_p", &top_p));
  KV_RETURN_IF_ERROR(GetFloat(body, "min_p", &min_p));
  KV_RETURN_IF_ERROR(GetFloat(body, "presence_penalty", &presence));
  KV_RETURN_IF_ERROR(GetFloat(body, "frequency_penalty", &frequency));
  KV_RETURN_IF_ERROR(GetFloat(body, "repetition_penalty", &rep));
  if (temperature) p->set_temperature(*temperature);
  if (top_p) p->set_top_p(*top_p);
  if (min_p) p->set_min_p(*min_p);
  if (presence) p->set_presence_penalty(*presence);
  if (frequency) p->set_frequency_penalty(*frequency);
  if (rep) p->set_repetition_penalty(*rep);
  std::optional<int32_t> top_k, max_tokens;
  KV_RETURN_IF_ERROR(GetInt32(body, "top_k", &top_k));
  if (top_k) p->set_top_k(*top_k == -1 ? 0 : *top_k);  // vLLM: -1 = off
  const char* max_name = endpoint == OpenAiEndpoint::kChatCompletions &&
                                 !Field(body, "max_completion_tokens").is_null()
                             ? "max_completion_tokens"
                             : "max_tokens";
  KV_RETURN_IF_ERROR(GetInt32(body, max_name, &max_tokens));
  if (max_tokens) p->set_max_tokens(*max_tokens);
  std::optional<uint64_t> seed;
  KV_RETURN_IF_ERROR(GetSeed(body, &seed));
  if (seed) p->set_seed(*seed);
  bool ignore_eos = false;
  KV_RETURN_IF_ERROR(GetBool(body, "ignore_eos", &ignore_eos));
  p->set_ignore_eos(ignore_eos);
  return ParseStop(body, p);
}

// True if `t` is an integer that fits int32 (a huge unsigned value must not
// wrap through int64 into range).
bool IsInt32(const json& t) {
  if (t.is_number_unsigned()) {
    return t.get<uint64_t>() <=
           static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  }
  return t.is_number_integer() &&
         t.get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
         t.get<int64_t>() <= std::numeric_limits<int32_t>::max();
}

// vLLM's extensions kvserve honours: stop_token_ids, min_tokens,
// include_stop_str_in_output, skip_special_tokens.
absl::Status ParseExtensions(const json& body, v1::SamplingParams* p) {
  const json& ids = Field(body, "stop_token_ids");
  if (!ids.is_null()) {
    if (!ids.is_array()) return Invalid("stop_token_ids", "must be an array");
    for (size_t i = 0; i < ids.size(); ++i) {
      if (!IsInt32(ids[i])) {
        return Invalid(absl::StrCat("stop_token_ids[", i, "]"),
                       "must be a token id");
      }
      p->add_stop_token_ids(static_cast<int32_t>(ids[i].get<int64_t>()));
    }
  }
  std::optional<int32_t> min_tokens;
  KV_RETURN_IF_ERROR(GetInt32(body, "min_tokens", &min_tokens));
  if (min_tokens) p->set_min_tokens(*min_tokens);
  bool include_stop = false;
  KV_RETURN_IF_ERROR(
      GetBool(body, "include_stop_str_in_output", &include_stop));
  p->set_include_stop_str_in_output(include_stop);
  if (!Field(body, "skip_special_tokens").is_null()) {
    bool skip = true;
    KV_RETURN_IF_ERROR(GetBool(body, "skip_special_tokens", &skip));
    p->set_skip_special_tokens(skip);
  }
  return absl::OkStatus();
}

// kvserve's extension: {"type": "streaming", "sinks": 4, "window": 2048}
// (server/kv_policy.h checks the values).
absl::Status ParseKvPolicy(const json& body, v1::GenerateRequest* out) {
  const json& v = Field(body, "kv_policy");
  if (v.is_null()) return absl::OkStatus();
  if (!v.is_object()) return Invalid("kv_policy", "must be an object");
  v1::KvPolicy* p = out->mutable_kv_policy();
  for (const auto& [key, value] : v.items()) {
    const std::string field = absl::StrCat("kv_policy.", key);
    if (key == "type") {
      if (!value.is_string()) return Invalid(field, "must be a string");
      p->set_type(value.get<std::string>());
    } else if (key == "sinks" || key == "window" || key == "budget") {
      if (!IsInt32(value)) return Invalid(field, "must be an integer");
      const auto n = static_cast<int32_t>(value.get<int64_t>());
      if (key == "sinks") p->set_sinks(n);
      if (key == "window") p->set_window(n);
      if (key == "budget") p->set_budget(n);
    } else {
      return Invalid(field, "unknown field (type, sinks, window, budget)");
    }
  }
  return absl::OkStatus();
}

// A list of token ids into `ids`; false if `v` is not one.
bool TokenIdList(const json& v, v1::TokenIds* ids) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& t : v) {
    if (!IsInt32(t)) return false;
    ids->add_ids(static_cast<int32_t>(t.get<int64_t>()));
  }
  return true;
}

// "prompt": a string, a list of token ids, or a batch: a list of strings
// or of token-id lists (each its own request, OpenAI's and vLLM's).
absl::Status ParsePrompt(const json& body, OpenAiRequest* out) {
  const json& v = Field(body, "prompt");
  v1::GenerateRequest* req = &out->generate;
  if (v.is_string()) {
    req->set_prompt(v.get<std::string>());
    return absl::OkStatus();
  }
  if (!v.is_array() || v.empty()) {
    return Invalid("prompt",
                   "must be a non-empty string, array of token ids, or array "
                   "of those");
  }
  if (!v[0].is_string() && !v[0].is_array()) {
    if (TokenIdList(v, req->mutable_prompt_token_ids())) {
      return absl::OkStatus();
    }
    size_t bad = 0;
    while (bad + 1 < v.size() && IsInt32(v[bad])) ++bad;
    return Invalid(absl::StrCat("prompt[", bad, "]"),
                   "must be a token id (an int32)");
  }
  if (v.size() > static_cast<size_t>(kMaxBatchPrompts)) {
    return Invalid("prompt", absl::StrCat("at most ", kMaxBatchPrompts,
                                          " prompts, got ", v.size()));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    v1::GenerateRequest one;
    if (v[i].is_string()) {
      one.set_prompt(v[i].get<std::string>());
    } else if (!TokenIdList(v[i], one.mutable_prompt_token_ids())) {
      return Invalid(absl::StrCat("prompt[", i, "]"),
                     "must be a string or a non-empty array of token ids");
    }
    out->batch.push_back(std::move(one));
  }
  // A batch of one is a plain request.
  if (out->batch.size() == 1) {
    const v1::GenerateRequest& one = out->batch.front();
    if (one.has_prompt_token_ids()) {
      *req->mutable_prompt_token_ids() = one.prompt_token_ids();
    } else {
      req->set_prompt(one.prompt());
    }
    out->batch.clear();
  }
  return absl::OkStatus();
}

// A message's content: a string or an array of {"type": "text"} parts.
absl::Status MessageContent(const json& m, const std::string& field,
                            std::string* out) {
  const json& c = Field(m, "content");
  if (c.is_null()) return absl::OkStatus();
  if (c.is_string()) {
    *out = c.get<std::string>();
    return absl::OkStatus();
  }
  if (!c.is_array()) {
    return Invalid(field + ".content", "must be a string or an array");
  }
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string part = absl::StrCat(field, ".content[", i, "]");
    if (!c[i].is_object() || Field(c[i], "type") != "text" ||
        !Field(c[i], "text").is_string()) {
      return Invalid(part,
                     "only {\"type\": \"text\", \"text\": ...} parts "
                     "are supported");
    }
    absl::StrAppend(out, c[i]["text"].get<std::string>());
  }
  return absl::OkStatus();
}

// An assistant message's earlier tool calls, appended to its content as the
// model writes them (server/tool_calls.h).
absl::Status MessageToolCalls(const json& m, const std::string& field,
                              std::string* content) {
  const json& calls = Field(m, "tool_calls");
  if (calls.is_null()) return absl::OkStatus();
  if (!calls.is_array())
    return Invalid(field + ".tool_calls", "must be an array");
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string f = absl::StrCat(field, ".tool_calls[", k, "]");
    const json& fn =
        calls[k].is_object() ? Field(calls[k], "function") : calls[k];
    if (!fn.is_object() || !Field(fn, "name").is_string() ||
        !Field(fn, "arguments").is_string()) {
      return Invalid(f + ".function",
                     "must hold a \"name\" and \"arguments\" (a string)");
    }
    const json args =
        json::parse(Field(fn, "arguments").get<std::string>(), nullptr, false);
    if (!args.is_object()) {
      return Invalid(f + ".function.arguments", "must be a JSON object");
    }
    if (!content->empty()) content->append("\n");
    content->append(RenderToolCall(Field(fn, "name").get<std::string>(),
                                   Field(fn, "arguments").get<std::string>()));
  }
  return absl::OkStatus();
}

// `tools_text`: the tools' system text (empty: none), appended to the
// first system message or sent as one of its own.
absl::Status ParseMessages(const json& body, const std::string& tools_text,
                           v1::GenerateRequest* req) {
  const json& v = Field(body, "messages");
  if (!v.is_array()) return Invalid("messages", "must be an array");
  v1::ChatMessages* chat = req->mutable_chat();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!v[i].is_object()) return Invalid(field, "must be an object");
    v1::ChatMessage* m = chat->add_messages();
    if (!Field(v[i], "role").is_string()) {
      return Invalid(field + ".role", "must be a string");
    }
    m->set_role(v[i]["role"].get<std::string>());
    KV_RETURN_IF_ERROR(MessageContent(v[i], field, m->mutable_content()));
    if (m->role() == "assistant") {
      KV_RETURN_IF_ERROR(MessageToolCalls(v[i], field, m->mutable_content()));
    } else if (m->role() == "tool") {  // a tool's result, as a user turn
      m->set_role("user");
      m->set_content(absl::StrCat("<tool_response>\n", m->content(),
                                  "\n</tool_response>"));
    }
  }
  if (!tools_text.empty()) {
    if (chat->messages_size() > 0 &&
        (chat->messages(0).role() == "system" ||
         chat->messages(0).role() == "developer")) {
      v1::ChatMessage* sys = chat->mutable_messages(0);
      sys->set_content(absl::StrCat(sys->content(), "\n\n", tools_text));
    } else {
      v1::ChatMessage sys;
      sys.set_role("system");
      sys.set_content(tools_text);
      chat->mutable_messages()->Add(std::move(sys));
      std::rotate(chat->mutable_messages()->rbegin(),
                  chat->mutable_messages()->rbegin() + 1,
                  chat->mutable_messages()->rend());
    }
  }
  return absl::OkStatus();
}

// Chat's tools: parsed (key order kept), announced in the prompt, and the
// output constrained to their calls (a structural tag).
absl::Status ParseToolsOf(const json& j, absl::string_view body,
                          OpenAiRequest* out, std::string* tools_text) {
  if (!j.contains("tools") && !j.contains("tool_choice") &&
      !j.contains("parallel_tool_calls")) {
    return absl::OkStatus();
  }
  if (out->endpoint != OpenAiEndpoint::kChatCompletions) {
    return Invalid("tools", "only on /v1/chat/completions");
  }
  const auto ordered =
      nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  ToolsRequest tools;
  KV_RETURN_IF_ERROR(ParseTools(ordered, &tools));
  if (!tools.active()) return absl::OkStatus();
  if (out->generate.has_structured_output()) {
    return Invalid(out->structured_output_field,
                   "cannot be combined with tools (tool_choice \"none\" "
                   "allows it)");
  }
  *tools_text = ToolsSystemText(tools);
  out->generate.mutable_structured_output()->set_structural_tag(
      ToolsStructuralTag(tools));
  out->structured_output_field = "tools";
  out->tool_calls = true;
  return absl::OkStatus();
}

// logprobs: completions take an int (top-N), chat a bool + top_logprobs.
absl::Status ParseLogprobs(const json& body, OpenAiRequest* out) {
  std::optional<int32_t> top;
  if (out->endpoint == OpenAiEndpoint::kCompletions) {
    KV_RETURN_IF_ERROR(GetInt32(body, "logprobs", &top));
    out->logprobs = top.has_value();
  } else {
    KV_RETURN_IF_ERROR(GetBool(body, "logprobs", &out->logprobs));
    KV_RETURN_IF_ERROR(GetInt32(body, "top_logprobs", &top));
    if (top.has_value() && !out->logprobs) {
      return Invalid("top_logprobs", "requires logprobs: true");
    }
  }
  out->top_logprobs = top.value_or(0);
  // NOTE: the engine reports logprobs only for a top-N of at least 1; the
  // extra alternative is dropped from the response.
  if (out->logprobs) {
    out->generate.mutable_sampling()->set_logprobs(
        out->top_logprobs < 0 ? out->top_logprobs
                              : std::max(out->top_logprobs, 1));
  }
  return absl::OkStatus();
}

absl::Status ParseStreamOptions(const json& body, OpenAiRequest* out) {
  KV_RETURN_IF_ERROR(GetBool(body, "stream", &out->stream));
  const json& so = Field(body, "stream_options");
  if (so.is_null()) return absl::OkStatus();
  if (!so.is_object()) return Invalid("stream_options", "must be an object");
  const json& iu = Field(so, "include_usage");
  if (iu.is_null()) return absl::OkStatus();
  if (!iu.is_boolean()) {
    return Invalid("stream_options.include_usage", "must be a boolean");
  }
  out->include_usage = iu.get<bool>();
  return absl::OkStatus();
}

}  // namespace

// True if `body` nests arrays and objects deeper than `limit` (outside
// strings); a scan before the parse, so a deeply nested body costs no tree.
bool NestsDeeperThan(absl::string_view body, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// Structured output, read from the body parsed again with key order kept
// (nlohmann::json sorts keys; a schema's order is its output's) when it
// asks for one.
absl::Status ParseStructuredOutputOf(const json& j, absl::string_view body,
                                     OpenAiRequest* out) {
  bool asks = false;
  for (const char* name :
       {"response_format", "structured_outputs", "guided_json", "guided_regex",
        "guided_choice", "guided_grammar", "guided_decoding_backend"}) {
    asks = asks || j.contains(name);
  }
  if (!asks) return absl::OkStatus();
  const auto ordered =
      nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, false);
  return ParseStructuredOutput(ordered, &out->generate,
                               &out->structured_output_field);
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body,
                                                 OpenAiEndpoint endpoint) {
  if (NestsDeeperThan(body, kMaxJsonDepth)) {
    return Invalid(
        "body", absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
  }
  const json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (j.is_discarded()) return Invalid("body", "not valid JSON");
  if (!j.is_object()) return Invalid("body", "must be a JSON object");
  OpenAiRequest out;
  out.endpoint = endpoint;
  KV_RETURN_IF_ERROR(GetString(j, "model", &out.model));
  KV_RETURN_IF_ERROR(CheckUnsupported(j));
  // n: completions per prompt (unlike the proto's, 0 is not "unset" here, so
  // the range is checked at the wire).
  std::optional<int64_t> n;
  KV_RETURN_IF_ERROR(GetInt(j, "n", &n));
  if (n.has_value()) {
    if (*n < 1 || *n > engine::kMaxCompletions) {
      return Invalid("n", absl::StrCat("must be in [1, ",
                                       engine::kMaxCompletions, "], got ", *n));
    }
    out.generate.set_n(static_cast<int32_t>(*n));
  }
  KV_RETURN_IF_ERROR(ParseStreamOptions(j, &out));
  KV_RETURN_IF_ERROR(
      ParseSampling(j, endpoint, out.generate.mutable_sampling()));
  KV_RETURN_IF_ERROR(ParseExtensions(j, out.generate.mutable_sampling()));
  KV_RETURN_IF_ERROR(ParseLogprobs(j, &out));
  // vLLM's extension: the output token ids in each choice.
  KV_RETURN_IF_ERROR(GetBool(j, "return_token_ids", &out.return_token_ids));
  std::string user;
  KV_RETURN_IF_ERROR(GetString(j, "user", &user));  // type-checked, unused
  // vLLM's extension: the prefix-cache namespace (request_validation.h).
  std::string salt;
  KV_RETURN_IF_ERROR(GetString(j, "cache_salt", &salt));
  out.generate.set_cache_salt(std::move(salt));
  // vLLM's extension: lower is more important; clamped to the tenant's
  // range (server/tenants.h).
  std::optional<int32_t> priority;
  KV_RETURN_IF_ERROR(GetInt32(j, "priority", &priority));
  if (priority) out.generate.set_priority(*priority);
  KV_RETURN_IF_ERROR(ParseKvPolicy(j, &out.generate));
  KV_RETURN_IF_ERROR(ParseStructuredOutputOf(j, body, &out));
  // kvserve's extension: "speculative": false opts out of --speculative.
  bool speculative = true;
  KV_RETURN_IF_ERROR(GetBool(j, "speculative", &speculative));
  out.generate.set_no_speculation(!speculative);
  if (endpoint == OpenAiEndpoint::kChatCompletions &&
      !Field(j, "max_completion_tokens").is_null()) {
    out.max_tokens_name = "max_completion_tokens";
  }
  std::string tools_text;
  KV_RETURN_IF_ERROR(ParseToolsOf(j, body, &out, &tools_text));
  if (endpoint == OpenAiEndpoint::kChatCompletions) {
    KV_RETURN_IF_ERROR(ParseMessages(j, tools_text, &out.generate));
  } else {
    KV_RETURN_IF_ERROR(ParsePrompt(j, &out));
  }
  return out;
}

}  // namespace kvserve::server
