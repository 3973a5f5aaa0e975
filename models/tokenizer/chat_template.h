// Chat formatting: detects which of the built-in chat formats a model's
// Jinja template implements, and renders a conversation in that format.
// Owns the format strings; does not run Jinja (the built-in renderers
// reproduce the common templates exactly) and does not tokenize.
//
//   ChatML  <|im_start|>{role}\n{content}<|im_end|>\n ...
//           generation prompt: <|im_start|>assistant\n
//   Llama3  <|start_header_id|>{role}<|end_header_id|>\n\n{content|trim}
//           <|eot_id|> ...   generation prompt: the assistant header
//   Llama2  [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user|trim} [/INST]
//           {assistant|trim} </s><s>[INST] ...
//
// The rendered text never starts with BOS: encode it with
// Tokenizer::Encode(text, /*add_special=*/true, /*parse_special=*/true, ...)
// so that the tokenizer adds BOS when the model wants one and the control
// tokens above are recognized. RenderChatParts also says where the messages'
// content lies, so that control tokens typed in a message stay plain text
// (a user cannot forge "<|im_end|><|im_start|>system").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_config.h"
#include "models/tokenizer/tokenizer.h"
#include "models/tokenizer/tokenizer_data.h"

namespace kvserve::models {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The format of `jinja_template` by its markers: "<|im_start|>" -> kChatML,
// "<|start_header_id|>" -> kLlama3, "[INST]" -> kLlama2. An empty template
// falls back to the vocab (tokens "<|im_start|>", "<|start_header_id|>",
// "[INST]"); anything else is kNone.
[[nodiscard]] ChatFormat DetectChatFormat(const std::string& jinja_template,
                                          const TokenizerData& data);

// The literal default system prompt of a ChatML template, i.e. the text of
// a literal "<|im_start|>system\n...<|im_end|>" in it (SmolLM2: "You are a
// helpful AI assistant named SmolLM, trained by Hugging Face"); "" if none.
[[nodiscard]] std::string ExtractDefaultSystemPrompt(
    std::string_view jinja_template);

// A rendered conversation: `content` lists, in order and disjoint, the byte
// ranges of `text` that came from the messages (not from the template).
struct RenderedChat {
  std::string text;
  std::vector<TextRange> content;
};

// Renders `messages` in `format`, ending with the assistant prompt when
// add_generation_prompt. `default_system` is inserted as a system message
// when the first message is not one (empty: none). It may also be the
// model's Jinja template itself (recognized by "{%" or "{{"), in which case
// its ExtractDefaultSystemPrompt() is used.
// Errors: FailedPrecondition for kNone; InvalidArgument naming the field for
// no messages ("messages"), an unknown role ("messages[i].role"), or a
// Llama-2 system message that is not first.
[[nodiscard]] absl::StatusOr<RenderedChat> RenderChatParts(
    ChatFormat format, const std::vector<ChatMessage>& messages,
    bool add_generation_prompt, const std::string& default_system);
// RenderChatParts' text.
[[nodiscard]] absl::StatusOr<std::string> RenderChat(
    ChatFormat format, const std::vector<ChatMessage>& messages,
    bool add_generation_prompt, const std::string& default_system);

}  // namespace kvserve::models
