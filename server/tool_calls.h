// Tool calling for chat completions (OpenAI's `tools`, `tool_choice`,
// `parallel_tool_calls`), on the Hermes / Qwen2.5 convention that ChatML
// models (the default model among them) are prompted with:
//   - the tools enter the prompt as a system message: the instructions and
//     each tool's {"type": "function", "function": {...}} inside
//     <tools></tools>, one per line (appended to the first system message,
//     or a system message of their own);
//   - a call is written <tool_call>\n{"name": N, "arguments": {...}}\n
//     </tool_call>; an assistant message's earlier `tool_calls` are
//     rendered so, and a `tool` message as a user turn holding
//     <tool_response>\n...\n</tool_response>.
// The output is constrained by an XGrammar structural tag: "auto" lets the
// model write text and, after the trigger "<tool_call>", only a well-formed
// call of a listed function whose arguments match its parameters schema;
// "required" asks for at least one call and no text; a named function for
// exactly that one; "none" renders and constrains nothing. The output is
// parsed back into `tool_calls` (whole or streamed, ToolCallStream).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kvserve::server {

struct ToolsRequest {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  // Each tool's {"type": "function", "function": {...}} as sent (key order
  // kept), its name and its parameters schema.
  std::vector<std::string> tool_json;
  std::vector<std::string> names;
  std::vector<std::string> parameters;  // JSON schema text
  Choice choice = Choice::kNone;
  std::string named;  // kNamed: the function
  bool parallel = true;
  [[nodiscard]] bool active() const {
    return choice != Choice::kNone && !names.empty();
  }
};

// Parses `tools`, `tool_choice` and `parallel_tool_calls` of a chat body
// (no tools: choice kNone). INVALID_ARGUMENT field errors with the body's
// names ("tools[1].function.name", "tool_choice").
[[nodiscard]] absl::Status ParseTools(const nlohmann::ordered_json& body,
                                      ToolsRequest* out);

// The system text that announces the tools.
[[nodiscard]] std::string ToolsSystemText(const ToolsRequest& tools);

// The structural tag (XGrammar JSON) that constrains the output to the
// request's choice; only for active() requests.
[[nodiscard]] std::string ToolsStructuralTag(const ToolsRequest& tools);

// An earlier call of an assistant message, as the model writes it.
[[nodiscard]] std::string RenderToolCall(absl::string_view name,
                                         absl::string_view arguments_json);

struct ToolCall {
  std::string id;  // "call_<request>_<n>"
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// Splits model output into text and calls: the content is exactly the text
// outside the calls, however the output is cut into pieces (a response
// whose content is blank around its calls says null). A <tool_call> block
// that does not parse as {"name", "arguments"} stays text.
class ToolCallStream {
 public:
  // `id_prefix` makes call ids unique within a response.
  explicit ToolCallStream(std::string id_prefix)
      : id_prefix_(std::move(id_prefix)) {}
  struct Out {
    std::string content;
    std::vector<ToolCall> calls;
  };
  // The text safe to emit now (never a partial "<tool_call>" that a later
  // piece may complete) and the calls closed by `text`.
  [[nodiscard]] Out Feed(absl::string_view text);
  // What is left at the end: an unclosed call is text.
  [[nodiscard]] Out Finish();
  // Calls found so far.
  [[nodiscard]] int32_t num_calls() const { return num_calls_; }

 private:
  std::string id_prefix_;
  std::string pending_;  // text not yet emitted
  int32_t num_calls_ = 0;
};

}  // namespace kvserve::server
