// Tool calling's text side (server/tool_calls.h): parsing of tools and
// tool_choice, the structural tag per choice, and ToolCallStream splitting
// output into content and calls however the text is cut into pieces.
#include "server/tool_calls.h"

#include <string>
#include <vector>

#include "common/field_error.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve::server {
namespace {

using json = nlohmann::ordered_json;

const char kTools[] = R"({"tools": [
  {"type": "function", "function": {"name": "get_weather",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time"}}]})";

TEST(ToolCallsTest, ParsesToolsAndChoices) {
  json body = json::parse(kTools);
  ToolsRequest t;
  ASSERT_TRUE(ParseTools(body, &t).ok());
  EXPECT_EQ(t.choice, ToolsRequest::Choice::kAuto);  // the default with tools
  EXPECT_EQ(t.names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(t.parameters[1], R"({"type": "object"})");
  body["tool_choice"] = {{"type", "function"},
                         {"function", {{"name", "get_time"}}}};
  body["parallel_tool_calls"] = false;
  t = {};
  ASSERT_TRUE(ParseTools(body, &t).ok());
  EXPECT_EQ(t.choice, ToolsRequest::Choice::kNamed);
  EXPECT_FALSE(t.parallel);
  const json tag = json::parse(ToolsStructuralTag(t));
  EXPECT_EQ(tag["format"]["type"], "tags_with_separator");
  ASSERT_EQ(tag["format"]["tags"].size(), 1u);  // the named one only
  EXPECT_EQ(tag["format"]["tags"][0]["begin"],
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": ");
  body["tool_choice"] = "auto";
  t = {};
  ASSERT_TRUE(ParseTools(body, &t).ok());
  EXPECT_EQ(json::parse(ToolsStructuralTag(t))["format"]["type"],
            "triggered_tags");
  EXPECT_NE(ToolsSystemText(t).find("\"name\":\"get_weather\""),
            std::string::npos);

  for (const auto& [bad, field] :
       std::vector<std::pair<std::string, std::string>>{
           {R"({"tools": [{"type": "retrieval"}]})", "tools[0].type"},
           {R"({"tools": [{"type": "function", "function": {"name": ""}}]})",
            "tools[0].function.name"},
           {R"({"tools": [{"type": "function", "function": {"name": "a"}},
                          {"type": "function", "function": {"name": "a"}}]})",
            "tools[1].function.name"},
           {R"({"tool_choice": "required"})", "tool_choice"},
           {R"({"tools": [{"type": "function", "function": {"name": "a"}}],
                "tool_choice": {"type": "function", "function": {"name": "b"}}})",
            "tool_choice.function.name"},
           {R"({"tools": [{"type": "function", "function": {"name": "a"}}],
                "tool_choice": "sometimes"})",
            "tool_choice"}}) {
    ToolsRequest r;
    const absl::Status s = ParseTools(json::parse(bad), &r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(ErrorField(s), field) << bad;
  }
}

TEST(ToolCallsTest, StreamSplitsContentAndCallsAtAnyCut) {
  const std::string text =
      "Let me check. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": "
      "\"get_time\", \"arguments\": {}}\n</tool_call> done <tool_call>\n{oops"
      "\n</tool_call> <tool_";
  for (size_t piece = 1; piece <= text.size(); ++piece) {
    ToolCallStream s("call_x_");
    std::string content;
    std::vector<ToolCall> calls;
    for (size_t at = 0; at < text.size(); at += piece) {
      ToolCallStream::Out out = s.Feed(text.substr(at, piece));
      // Never a partial "<tool_call" in emitted content.
      EXPECT_EQ(out.content.find("<tool_call>\n{\""), std::string::npos);
      content += out.content;
      calls.insert(calls.end(), out.calls.begin(), out.calls.end());
    }
    content += s.Finish().content;
    ASSERT_EQ(calls.size(), 2u) << piece;
    EXPECT_EQ(calls[0].id, "call_x_0");
    EXPECT_EQ(calls[0].name, "get_weather");
    EXPECT_EQ(calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(calls[1].name, "get_time");
    EXPECT_EQ(calls[1].arguments, "{}");
    // A block that is not a call stays text, as does an unclosed tail.
    EXPECT_EQ(content,
              "Let me check. \n done <tool_call>\n{oops\n</tool_call> <tool_")
        << piece;
  }
}

TEST(ToolCallsTest, RenderedCallIsWhatTheGrammarWrites) {
  EXPECT_EQ(RenderToolCall("f", R"({"a": 1})"),
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n"
            "</tool_call>");
}

}  // namespace
}  // namespace kvserve::server
