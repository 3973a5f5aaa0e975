#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/field_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/openai_json.h"
#include "server/openai_specs.h"

namespace kvserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr auto kCompletions = OpenAiEndpoint::kCompletions;
constexpr auto kChat = OpenAiEndpoint::kChatCompletions;

// The completions body is refused, naming `field`.
void ExpectInvalidBody(const std::string& body, const std::string& field) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(body, kCompletions);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), StartsWith(field + ": "))
      << body;
  EXPECT_EQ(ErrorField(r.status()), field) << body;
}

TEST(OpenAiJsonTest, ParsesCompletionFields) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "hi", "max_tokens": 8, "temperature": 0,
          "top_p": 0.9, "top_k": 5, "seed": 7, "stop": ["a", "b"],
          "logprobs": 3, "stream": true,
          "stream_options": {"include_usage": true}, "ignore_eos": true,
          "user": "u", "n": 1})",
      kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->generate.prompt(), "hi");
  const v1::SamplingParams& p = r->generate.sampling();
  EXPECT_EQ(p.max_tokens(), 8);
  EXPECT_EQ(p.temperature(), 0);
  EXPECT_FLOAT_EQ(p.top_p(), 0.9f);
  EXPECT_EQ(p.top_k(), 5);
  EXPECT_EQ(p.seed(), 7u);
  ASSERT_EQ(p.stop_size(), 2);
  EXPECT_EQ(p.logprobs(), 3);
  EXPECT_TRUE(p.ignore_eos());
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  EXPECT_FALSE(r->return_token_ids);
}

TEST(OpenAiJsonTest, ReturnTokenIdsIsABoolean) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"prompt": "hi", "return_token_ids": true})", kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->return_token_ids);
  ExpectInvalidBody(R"({"prompt": "hi", "return_token_ids": 1})",
                    "return_token_ids");
}

TEST(OpenAiJsonTest, ParsesTokenPromptAndChat) {
  absl::StatusOr<OpenAiRequest> r =
      ParseOpenAiRequest(R"({"prompt": [1, 2, 3]})", kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.prompt_token_ids().ids_size(), 3);
  r = ParseOpenAiRequest(
      R"({"messages": [{"role": "user", "content": "x"},
          {"role": "user", "content": [{"type": "text", "text": "y"}]}],
          "max_completion_tokens": 4, "logprobs": true})",
      kChat);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->generate.chat().messages_size(), 2);
  EXPECT_EQ(r->generate.chat().messages(1).content(), "y");
  EXPECT_EQ(r->generate.sampling().max_tokens(), 4);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 0);
  EXPECT_EQ(r->generate.sampling().logprobs(), 1);  // engine needs >= 1
}

// Seeds take the proto's whole uint64 range exactly; integral floats count
// as integers.
TEST(OpenAiJsonTest, SeedsAndIntegralFloats) {
  auto seed = [](const std::string& value) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
        absl::StrCat(R"({"prompt": "x", "seed": )", value, "}"), kCompletions);
    return r.ok() ? std::optional<uint64_t>(r->generate.sampling().seed())
                  : std::nullopt;
  };
  EXPECT_EQ(seed("18446744073709551615"), 18446744073709551615u);
  EXPECT_EQ(seed("9223372036854775807"), 9223372036854775807u);
  EXPECT_EQ(seed("9223372036854775808"), 9223372036854775808u);
  EXPECT_EQ(seed("0"), 0u);
  EXPECT_EQ(seed("7.0"), 7u);
  absl::StatusOr<OpenAiRequest> r =
      ParseOpenAiRequest(R"({"prompt": "x", "seed": -1})", kCompletions);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              StartsWith("seed: out of range: must be an integer in [0, "
                         "18446744073709551615], got -1"));
  // An integral float in range is that integer (1e19 < 2^64).
  EXPECT_EQ(seed("1e19"), 10000000000000000000u);
  ExpectInvalidBody(R"({"prompt": "x", "seed": 1e30})", "seed");
  ExpectInvalidBody(R"({"prompt": "x", "seed": 18446744073709551616})", "seed");
  ExpectInvalidBody(R"({"prompt": "x", "seed": 1.5})", "seed");
  r = ParseOpenAiRequest(R"({"prompt": "x", "max_tokens": 7.0, "n": 2.0})",
                         kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.sampling().max_tokens(), 7);
  EXPECT_EQ(r->generate.n(), 2);
}

// A tiny float is its smallest neighbour, not 0 (top_p 1e-50 is valid);
// "priority" is read; an error about max_tokens names the field the
// client sent.
TEST(OpenAiJsonTest, TinyFloatsPriorityAndMaxTokensName) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"prompt": "x", "top_p": 1e-50, "priority": -7})", kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->generate.sampling().top_p(), 0.0f);
  EXPECT_EQ(r->generate.priority(), -7);
  ExpectInvalidBody(R"({"prompt": "x", "priority": 1e10})", "priority");
  r = ParseOpenAiRequest(
      R"({"messages": [{"role": "user", "content": "hi"}],
          "max_completion_tokens": 5})",
      kChat);
  ASSERT_TRUE(r.ok()) << r.status();
  const absl::Status named = ClientFieldNames(
      InvalidFieldError("sampling.max_tokens", "at most 4, got 5"), *r);
  EXPECT_EQ(named.message(), "max_completion_tokens: at most 4, got 5");
  EXPECT_EQ(ErrorField(named), "max_completion_tokens");
}

// vLLM's extensions are honoured; the options kvserve lacks are refused.
TEST(OpenAiJsonTest, ExtensionsAreHonouredOrRefused) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"prompt": "x", "stop_token_ids": [2, 7], "min_tokens": 3,
          "include_stop_str_in_output": true, "skip_special_tokens": false,
          "response_format": {"type": "text"}})",
      kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::SamplingParams& p = r->generate.sampling();
  ASSERT_EQ(p.stop_token_ids_size(), 2);
  EXPECT_EQ(p.stop_token_ids(1), 7);
  EXPECT_EQ(p.min_tokens(), 3);
  EXPECT_TRUE(p.include_stop_str_in_output());
  ASSERT_TRUE(p.has_skip_special_tokens());
  EXPECT_FALSE(p.skip_special_tokens());
  r = ParseOpenAiRequest(R"({"prompt": "x"})", kCompletions);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->generate.sampling().has_skip_special_tokens());
  ExpectInvalidBody(R"({"prompt": "x", "prompt_logprobs": 1})",
                    "prompt_logprobs");
  ExpectInvalidBody(R"({"prompt": "x", "stop_token_ids": [1, "a"]})",
                    "stop_token_ids[1]");
  ExpectInvalidBody(R"({"prompt": "x", "min_tokens": "3"})", "min_tokens");
}

// Structured output from OpenAI's response_format and vLLM's
// structured_outputs / guided_*: one StructuredOutput, the body's field
// remembered for compile errors, a schema's key order kept.
TEST(OpenAiJsonTest, StructuredOutputFields) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"prompt": "x", "response_format": {"type": "json_schema",
          "json_schema": {"name": "p", "strict": true, "schema":
          {"type": "object", "properties": {"z": {}, "a": {}}}}}})",
      kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.structured_output().json_schema(),
            R"({"type":"object","properties":{"z":{},"a":{}}})");
  EXPECT_EQ(r->structured_output_field, "response_format.json_schema.schema");
  r = ParseOpenAiRequest(
      R"({"prompt": "x", "response_format": {"type": "json_object"}})",
      kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->generate.structured_output().json_object());
  r = ParseOpenAiRequest(R"({"prompt": "x", "guided_choice": ["a", "b"],
                             "guided_decoding_backend": "xgrammar"})",
                         kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.structured_output().choice().choices_size(), 2);
  EXPECT_EQ(r->structured_output_field, "guided_choice");
  r = ParseOpenAiRequest(
      R"({"prompt": "x", "structured_outputs": {"regex": "[0-9]+"}})",
      kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.structured_output().regex(), "[0-9]+");
  EXPECT_EQ(r->structured_output_field, "structured_outputs.regex");
  r = ParseOpenAiRequest(R"({"prompt": "x", "guided_json": "{\"type\": 1}"})",
                         kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generate.structured_output().json_schema(), R"({"type": 1})");
  r = ParseOpenAiRequest(
      R"({"prompt": "x", "response_format": {"type": "text"}})", kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->generate.has_structured_output());

  ExpectInvalidBody(
      R"({"prompt": "x", "guided_json": {}, "guided_regex": "a"})",
      "guided_regex");
  ExpectInvalidBody(R"({"prompt": "x", "guided_choice": ["a", 1]})",
                    "guided_choice[1]");
  ExpectInvalidBody(R"({"prompt": "x", "guided_regex": 5})", "guided_regex");
  ExpectInvalidBody(R"({"prompt": "x", "response_format": {"type": "xml"}})",
                    "response_format.type");
  ExpectInvalidBody(
      R"({"prompt": "x", "response_format": {"type": "json_schema"}})",
      "response_format.json_schema");
  ExpectInvalidBody(R"({"prompt": "x", "response_format":
                        {"type": "json_schema", "json_schema": {"name": "n"}}})",
                    "response_format.json_schema.schema");
  ExpectInvalidBody(
      R"({"prompt": "x", "structured_outputs": {"whitespace_pattern": "x"}})",
      "structured_outputs.whitespace_pattern");
  ExpectInvalidBody(
      R"({"prompt": "x", "guided_regex": "a", "guided_decoding_backend": "outlines"})",
      "guided_decoding_backend");
}

// A list of prompts (strings or token-id lists) is a batch; a list of one
// is a plain prompt.
TEST(OpenAiJsonTest, BatchPrompts) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"prompt": ["a", [5, 6]], "max_tokens": 3})", kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->batch.size(), 2u);
  EXPECT_EQ(r->batch[0].prompt(), "a");
  EXPECT_EQ(r->batch[1].prompt_token_ids().ids_size(), 2);
  EXPECT_EQ(r->generate.sampling().max_tokens(), 3);
  r = ParseOpenAiRequest(R"({"prompt": [[7, 8]]})", kCompletions);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->batch.empty());
  EXPECT_EQ(r->generate.prompt_token_ids().ids_size(), 2);
  ExpectInvalidBody(R"({"prompt": ["a", 5]})", "prompt[1]");
  ExpectInvalidBody(R"({"prompt": ["a", []]})", "prompt[1]");
  ExpectInvalidBody(R"({"prompt": [[1, "x"]]})", "prompt[0]");
  // A huge unsigned id does not wrap into range.
  ExpectInvalidBody(R"({"prompt": [18446744073709551615]})", "prompt[0]");
  ExpectInvalidBody(R"({"prompt": "x", "stop_token_ids": [4294967297]})",
                    "stop_token_ids[0]");
  std::string many = R"({"prompt": [)";
  for (int i = 0; i <= kMaxBatchPrompts; ++i) many += i ? ", \"x\"" : "\"x\"";
  ExpectInvalidBody(many + "]}", "prompt");
}

void ExpectInvalid(const std::string& body, OpenAiEndpoint endpoint,
                   const std::string& field) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(body, endpoint);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), StartsWith(field + ": "))
      << body;
  EXPECT_EQ(ErrorField(r.status()), field) << body;
}

TEST(OpenAiJsonTest, RejectsWrongTypesAndUnsupported) {
  ExpectInvalid("{not json", kCompletions, "body");
  ExpectInvalid("[1]", kCompletions, "body");
  ExpectInvalid(R"({"prompt": "x", "temperature": "hot"})", kCompletions,
                "temperature");
  ExpectInvalid(R"({"prompt": "x", "max_tokens": 1.5})", kCompletions,
                "max_tokens");
  ExpectInvalid(R"({"prompt": "x", "n": 17})", kCompletions, "n");  // 1..16
  ExpectInvalid(R"({"prompt": "x", "echo": true})", kCompletions, "echo");
  ExpectInvalid(R"({"prompt": "x", "stop": [1]})", kCompletions, "stop[0]");
  ExpectInvalid(R"({"prompt": "x", "stream": "yes"})", kCompletions, "stream");
  ExpectInvalid(R"({"prompt": [1, "a"]})", kCompletions, "prompt[1]");
  ExpectInvalid(R"({"prompt": 5})", kCompletions, "prompt");
  ExpectInvalid(R"({"messages": "hi"})", kChat, "messages");
  ExpectInvalid(R"({"messages": [{"role": 1}]})", kChat, "messages[0].role");
  ExpectInvalid(R"({"messages": [], "top_logprobs": 2})", kChat,
                "top_logprobs");
  // Nesting is bounded; brackets inside strings do not count.
  const std::string deep = std::string(65, '[') + std::string(65, ']');
  ExpectInvalid(absl::StrCat(R"({"prompt": "x", "user": )", deep, "}"),
                kCompletions, "body");
  EXPECT_TRUE(ParseOpenAiRequest(absl::StrCat(R"({"prompt": ")",
                                              std::string(100, '['), R"("})"),
                                 kCompletions)
                  .ok());
  EXPECT_TRUE(ParseOpenAiRequest(
                  absl::StrCat(R"({"prompt": "\"[", "x": )",
                               std::string(60, '['), std::string(60, ']'), "}"),
                  kCompletions)
                  .ok());
}

TEST(OpenAiJsonTest, RendersValidationFieldsInOpenAiNames) {
  auto renamed = [](const char* field, OpenAiEndpoint e,
                    std::optional<size_t> batch_index = std::nullopt) {
    OpenAiRequest request;
    request.endpoint = e;
    const absl::Status s =
        ClientFieldNames(InvalidFieldError(field, "bad"), request, batch_index);
    EXPECT_EQ(absl::StrCat(ErrorField(s).value_or("(none)"), ": bad"),
              s.message());
    return std::string(s.message());
  };
  EXPECT_EQ(renamed("sampling.top_p", kCompletions), "top_p: bad");
  EXPECT_EQ(renamed("sampling.logprobs", kCompletions), "logprobs: bad");
  EXPECT_EQ(renamed("sampling.logprobs", kChat), "top_logprobs: bad");
  EXPECT_EQ(renamed("sampling.max_tokens", kChat), "max_tokens: bad");
  EXPECT_EQ(renamed("chat.messages[0].role", kChat), "messages[0].role: bad");
  EXPECT_EQ(renamed("chat", kChat), "messages: bad");
  EXPECT_EQ(renamed("prompt_token_ids.ids[2]", kCompletions), "prompt[2]: bad");
  EXPECT_EQ(renamed("prompt_token_ids", kCompletions), "prompt: bad");
  EXPECT_EQ(renamed("n", kCompletions), "n: bad");
  // The engine names a prompt of any input "prompt".
  EXPECT_EQ(renamed("prompt", kCompletions), "prompt: bad");
  EXPECT_EQ(renamed("prompt", kChat), "messages: bad");
  // A batch's prompt is named by its index.
  EXPECT_EQ(renamed("prompt", kCompletions, 1), "prompt[1]: bad");
  EXPECT_EQ(renamed("prompt_token_ids.ids[0]", kCompletions, 3),
            "prompt[3][0]: bad");
  EXPECT_EQ(renamed("sampling.top_p", kCompletions, 3), "top_p: bad");
  // A status that names no field passes unchanged.
  const absl::Status plain = absl::InvalidArgumentError("sampling.top_p: x");
  EXPECT_EQ(ClientFieldNames(plain, OpenAiRequest{}, 0), plain);
}

TEST(OpenAiJsonTest, MapsStatusToHttp) {
  HttpError e = ToHttpError(absl::InvalidArgumentError("top_p: bad"));
  EXPECT_EQ(e.http_status, 400);
  nlohmann::json j = nlohmann::json::parse(e.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["error"]["param"], "top_p");
  // A field error's param is the field it names.
  j = nlohmann::json::parse(
      ToHttpError(InvalidFieldError("prompt[1][0]", "bad")).body, nullptr,
      false);
  EXPECT_EQ(j["error"]["param"], "prompt[1][0]");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(ToHttpError(absl::NotFoundError("model: x")).http_status, 404);
  EXPECT_THAT(ToHttpError(absl::NotFoundError("model: x")).body,
              HasSubstr("model_not_found"));
  EXPECT_EQ(ToHttpError(absl::ResourceExhaustedError("q")).http_status, 429);
  EXPECT_EQ(ToHttpError(absl::UnavailableError("d")).http_status, 503);
  EXPECT_EQ(ToHttpError(absl::InternalError("x")).http_status, 500);
  EXPECT_EQ(ToHttpError(absl::OutOfRangeError("x")).http_status, 400);
}

TEST(OpenAiJsonTest, ModelsBody) {
  engine::ModelInfo info;
  info.max_context = 8192;
  info.kv_dtype = kvcache::KvDtype::kInt8;
  info.kv_bytes_per_token = 12240;
  info.block_size = 16;
  info.num_blocks = 321;
  info.device = "cpu";
  nlohmann::json j =
      nlohmann::json::parse(ModelsBody("m", 5, info), nullptr, false);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "m");
  EXPECT_EQ(j["data"][0]["owned_by"], "kvserve");
  EXPECT_EQ(j["data"][0]["max_model_len"], 8192);
  const nlohmann::json& kv = j["data"][0]["kvserve"];
  EXPECT_EQ(kv["kv_cache_dtype"], "int8");
  EXPECT_EQ(kv["kv_bytes_per_token"], 12240);
  EXPECT_EQ(kv["block_size"], 16);
  EXPECT_EQ(kv["num_blocks"], 321);
  EXPECT_EQ(kv["device"], "cpu");
}

}  // namespace
}  // namespace kvserve::server
