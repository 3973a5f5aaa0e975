// Tool calling on the Hermes / Qwen2.5 convention. See tool_calls.h.
#include "server/tool_calls.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/field_error.h"
#include "common/status_macros.h"
#include "server/json_field.h"

namespace kvserve::server {
namespace {

using json = nlohmann::ordered_json;

constexpr char kOpen[] = "<tool_call>";
constexpr char kClose[] = "</tool_call>";
constexpr size_t kOpenLen = sizeof(kOpen) - 1;
constexpr size_t kCloseLen = sizeof(kClose) - 1;

absl::Status ParseTool(const json& t, size_t i, ToolsRequest* out) {
  const std::string field = absl::StrCat("tools[", i, "]");
  if (!t.is_object() || Field(t, "type") != "function") {
    return InvalidFieldError(field + ".type", "must be \"function\"");
  }
  const json& f = Field(t, "function");
  if (!f.is_object()) {
    return InvalidFieldError(field + ".function", "must be an object");
  }
  const json& name = Field(f, "name");
  if (!name.is_string() || name.get<std::string>().empty() ||
      name.get<std::string>().size() > 64) {
    return InvalidFieldError(field + ".function.name",
                             "must be a string of 1 to 64 characters");
  }
  for (const std::string& seen : out->names) {
    if (seen == name.get<std::string>()) {
      return InvalidFieldError(field + ".function.name",
                               absl::StrCat("\"", seen, "\" is listed twice"));
    }
  }
  const json& params = Field(f, "parameters");
  if (!params.is_null() && !params.is_object()) {
    return InvalidFieldError(field + ".function.parameters",
                             "must be a JSON schema (an object)");
  }
  out->names.push_back(name.get<std::string>());
  out->parameters.push_back(params.is_null() ? R"({"type": "object"})"
                                             : params.dump());
  out->tool_json.push_back(t.dump());
  return absl::OkStatus();
}

absl::Status ParseChoice(const json& c, ToolsRequest* out) {
  using Choice = ToolsRequest::Choice;
  if (c.is_null()) {
    out->choice = out->names.empty() ? Choice::kNone : Choice::kAuto;
    return absl::OkStatus();
  }
  if (c.is_string()) {
    const std::string s = c.get<std::string>();
    if (s == "none") {
      out->choice = Choice::kNone;
    } else if (s == "auto") {
      out->choice = Choice::kAuto;
    } else if (s == "required") {
      out->choice = Choice::kRequired;
    } else {
      return InvalidFieldError("tool_choice",
                               "must be \"none\", \"auto\", \"required\" or "
                               "{\"type\": \"function\", \"function\": "
                               "{\"name\": ...}}");
    }
  } else {
    const json& f = c.is_object() ? Field(c, "function") : c;
    if (!c.is_object() || Field(c, "type") != "function" || !f.is_object() ||
        !Field(f, "name").is_string()) {
      return InvalidFieldError("tool_choice.function.name",
                               "must name a function");
    }
    out->choice = Choice::kNamed;
    out->named = Field(f, "name").get<std::string>();
    bool known = false;
    for (const std::string& n : out->names) known = known || n == out->named;
    if (!known) {
      return InvalidFieldError(
          "tool_choice.function.name",
          absl::StrCat("\"", out->named, "\" is not among the tools"));
    }
  }
  if (out->choice != Choice::kNone && out->names.empty()) {
    return InvalidFieldError("tool_choice", "needs tools");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseTools(const json& body, ToolsRequest* out) {
  const json& tools = Field(body, "tools");
  if (!tools.is_null()) {
    if (!tools.is_array() || tools.size() > 128) {
      return InvalidFieldError("tools", "must be an array of at most 128");
    }
    for (size_t i = 0; i < tools.size(); ++i) {
      KV_RETURN_IF_ERROR(ParseTool(tools[i], i, out));
    }
  }
  const json& parallel = Field(body, "parallel_tool_calls");
  if (!parallel.is_null()) {
    if (!parallel.is_boolean()) {
      return InvalidFieldError("parallel_tool_calls", "must be a boolean");
    }
    out->parallel = parallel.get<bool>();
  }
  return ParseChoice(Field(body, "tool_choice"), out);
}

std::string ToolsSystemText(const ToolsRequest& tools) {
  std::string text =
      "# Tools\n\nYou may call one or more functions to assist with the user "
      "query.\n\nYou are provided with function signatures within "
      "<tools></tools> XML tags:\n<tools>";
  for (const std::string& t : tools.tool_json) absl::StrAppend(&text, "\n", t);
  absl::StrAppend(
      &text,
      "\n</tools>\n\nFor each function call, return a json object with "
      "function name and arguments within <tool_call></tool_call> XML "
      "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
      "<args-json-object>}\n</tool_call>");
  return text;
}

std::string ToolsStructuralTag(const ToolsRequest& tools) {
  json tags = json::array();
  for (size_t i = 0; i < tools.names.size(); ++i) {
    if (tools.choice == ToolsRequest::Choice::kNamed &&
        tools.names[i] != tools.named) {
      continue;
    }
    json schema = json::parse(tools.parameters[i], nullptr, false);
    tags.push_back(
        {{"type", "tag"},
         {"begin",
          absl::StrCat(kOpen, "\n{\"name\": ", json(tools.names[i]).dump(),
                       ", \"arguments\": ")},
         {"content", {{"type", "json_schema"}, {"json_schema", schema}}},
         {"end", absl::StrCat("}\n", kClose)}});
  }
  const bool stop_after_first =
      tools.choice == ToolsRequest::Choice::kNamed || !tools.parallel;
  json format;
  if (tools.choice == ToolsRequest::Choice::kAuto) {
    // Text, and after the trigger only a well-formed call.
    format = {{"type", "triggered_tags"},
              {"triggers", json::array({kOpen})},
              {"tags", std::move(tags)},
              {"at_least_one", false},
              {"stop_after_first", stop_after_first}};
  } else {
    // Calls only, one per line, at least one.
    format = {{"type", "tags_with_separator"},
              {"tags", std::move(tags)},
              {"separator", "\n"},
              {"at_least_one", true},
              {"stop_after_first", stop_after_first}};
  }
  return json{{"type", "structural_tag"}, {"format", std::move(format)}}.dump();
}

std::string RenderToolCall(absl::string_view name,
                           absl::string_view arguments_json) {
  return absl::StrCat(kOpen, "\n{\"name\": ", json(std::string(name)).dump(),
                      ", \"arguments\": ", arguments_json, "}\n", kClose);
}

ToolCallStream::Out ToolCallStream::Feed(absl::string_view text) {
  Out out;
  pending_.append(text.data(), text.size());
  while (true) {
    const size_t open = pending_.find(kOpen);
    if (open == std::string::npos) {
      // Keep a tail that may begin "<tool_call>".
      size_t keep = 0;
      for (size_t k = std::min(pending_.size(), kOpenLen - 1); k > 0; --k) {
        if (absl::string_view(pending_).substr(pending_.size() - k) ==
            absl::string_view(kOpen, k)) {
          keep = k;
          break;
        }
      }
      out.content += pending_.substr(0, pending_.size() - keep);
      pending_.erase(0, pending_.size() - keep);
      return out;
    }
    out.content += pending_.substr(0, open);
    pending_.erase(0, open);
    const size_t close = pending_.find(kClose);
    if (close == std::string::npos) return out;  // the call is still open
    const std::string inner = pending_.substr(kOpenLen, close - kOpenLen);
    const json call = json::parse(inner, nullptr, false);
    if (call.is_object() && Field(call, "name").is_string() &&
        Field(call, "arguments").is_object()) {
      out.calls.push_back({absl::StrCat(id_prefix_, num_calls_++),
                           Field(call, "name").get<std::string>(),
                           Field(call, "arguments").dump()});
    } else {
      out.content += pending_.substr(0, close + kCloseLen);
    }
    pending_.erase(0, close + kCloseLen);
  }
}

ToolCallStream::Out ToolCallStream::Finish() {
  Out out;
  out.content = std::move(pending_);
  pending_.clear();
  return out;
}

}  // namespace kvserve::server
