#include "models/tokenizer/chat_template.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kvserve::models {
namespace {

constexpr char kImStart[] = "<|im_start|>";
constexpr char kImEnd[] = "<|im_end|>";
constexpr char kStartHeader[] = "<|start_header_id|>";
constexpr char kInst[] = "[INST]";

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

bool InVocab(const TokenizerData& data, std::string_view token) {
  return std::find(data.tokens.begin(), data.tokens.end(), token) !=
         data.tokens.end();
}

std::string Trim(std::string_view s) {
  const absl::string_view t =
      absl::StripAsciiWhitespace(absl::string_view(s.data(), s.size()));
  return std::string(t.data(), t.size());
}

// Undoes the escapes of a Jinja string literal (\n, \t, \\, \', \").
std::string UnescapeJinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
  }
  return out;
}

absl::Status ValidateRoles(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) {
    return absl::InvalidArgumentError("messages: must not be empty");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role: must be system, user, or ",
                       "assistant, got '", absl::CEscape(role), "'"));
    }
  }
  return absl::OkStatus();
}

// A rendering under construction: template text, and the message content
// within it (TextRange, to be tokenized as plain text).
class ChatText {
 public:
  void Template(std::string_view s) { out_.text.append(s); }
  void Content(std::string_view s) {
    const size_t begin = out_.text.size();
    out_.text.append(s);
    if (!s.empty()) out_.content.push_back({begin, out_.text.size()});
  }
  void Append(const ChatText& other) {
    const size_t offset = out_.text.size();
    out_.text += other.out_.text;
    for (const TextRange& r : other.out_.content) {
      out_.content.push_back({r.begin + offset, r.end + offset});
    }
  }
  // Strips ASCII whitespace at both ends, clipping the content ranges.
  void Trim() {
    const std::string& t = out_.text;
    const absl::string_view kept = absl::StripAsciiWhitespace(t);
    const size_t lead = kept.data() - t.data();
    const size_t end = lead + kept.size();
    std::vector<TextRange> clipped;
    for (const TextRange& r : out_.content) {
      const size_t b = std::max(r.begin, lead), e = std::min(r.end, end);
      if (b < e) clipped.push_back({b - lead, e - lead});
    }
    out_.text = std::string(kept);
    out_.content = std::move(clipped);
  }
  RenderedChat Take() { return std::move(out_); }

 private:
  RenderedChat out_;
};

RenderedChat RenderChatMl(const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt,
                          const std::string& default_system) {
  ChatText out;
  if (!default_system.empty() && messages.front().role != "system") {
    out.Template(
        absl::StrCat(kImStart, "system\n", default_system, kImEnd, "\n"));
  }
  for (const ChatMessage& m : messages) {
    out.Template(absl::StrCat(kImStart, m.role, "\n"));
    out.Content(m.content);
    out.Template(absl::StrCat(kImEnd, "\n"));
  }
  if (add_generation_prompt)
    out.Template(absl::StrCat(kImStart, "assistant\n"));
  return out.Take();
}

void Llama3Turn(std::string_view role, std::string_view content,
                ChatText* out) {
  out->Template(kStartHeader);
  out->Template(role);
  out->Template("<|end_header_id|>\n\n");
  out->Content(Trim(content));
  out->Template("<|eot_id|>");
}

RenderedChat RenderLlama3(const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt,
                          const std::string& default_system) {
  ChatText out;
  if (!default_system.empty() && messages.front().role != "system") {
    Llama3Turn("system", default_system, &out);
  }
  for (const ChatMessage& m : messages) Llama3Turn(m.role, m.content, &out);
  if (add_generation_prompt) {
    out.Template(absl::StrCat(kStartHeader, "assistant<|end_header_id|>\n\n"));
  }
  return out.Take();
}

// Llama 2's template folds the system message into the first user turn and
// has no generation prompt (the text ends after "[/INST]").
absl::StatusOr<RenderedChat> RenderLlama2(
    const std::vector<ChatMessage>& messages,
    const std::string& default_system) {
  std::optional<std::string> system;
  if (!default_system.empty()) system = default_system;
  size_t first = 0;
  if (messages.front().role == "system") {
    system = messages.front().content;
    first = 1;
  }
  ChatText out;
  bool first_user = true;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system") {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i,
          "].role: system is only allowed as the first message in this "
          "model's chat format"));
    }
    if (m.role == "assistant") {
      out.Template(" ");
      out.Content(Trim(m.content));
      out.Template(" </s>");
      continue;
    }
    ChatText turn;
    if (first_user && system.has_value()) {
      turn.Template("<<SYS>>\n");
      turn.Content(*system);
      turn.Template("\n<</SYS>>\n\n");
    }
    turn.Content(m.content);
    turn.Trim();
    out.Template(absl::StrCat(first_user ? "" : "<s>", kInst, " "));
    out.Append(turn);
    out.Template(" [/INST]");
    first_user = false;
  }
  return out.Take();
}

}  // namespace

ChatFormat DetectChatFormat(const std::string& jinja_template,
                            const TokenizerData& data) {
  if (!jinja_template.empty()) {
    if (Contains(jinja_template, kImStart)) return ChatFormat::kChatML;
    if (Contains(jinja_template, kStartHeader)) return ChatFormat::kLlama3;
    if (Contains(jinja_template, kInst)) return ChatFormat::kLlama2;
    return ChatFormat::kNone;
  }
  if (InVocab(data, kImStart)) return ChatFormat::kChatML;
  if (InVocab(data, kStartHeader)) return ChatFormat::kLlama3;
  if (InVocab(data, kInst)) return ChatFormat::kLlama2;
  return ChatFormat::kNone;
}

std::string ExtractDefaultSystemPrompt(std::string_view jinja_template) {
  const std::string marker = absl::StrCat(kImStart, "system");
  for (size_t pos = jinja_template.find(marker); pos != std::string_view::npos;
       pos = jinja_template.find(marker, pos + 1)) {
    std::string_view rest = jinja_template.substr(pos + marker.size());
    if (rest.starts_with('\n')) {
      rest.remove_prefix(1);
    } else if (rest.starts_with("\\n")) {
      rest.remove_prefix(2);
    } else {
      continue;
    }
    const size_t end = rest.find(kImEnd);
    if (end == std::string_view::npos || end == 0) continue;
    const std::string_view text = rest.substr(0, end);
    // A literal only: no Jinja expression, concatenation or string end.
    if (text.find_first_of("{}'\"+") != std::string_view::npos) continue;
    return UnescapeJinja(text);
  }
  return "";
}

absl::StatusOr<RenderedChat> RenderChatParts(
    ChatFormat format, const std::vector<ChatMessage>& messages,
    bool add_generation_prompt, const std::string& default_system) {
  if (format == ChatFormat::kNone) {
    return absl::FailedPreconditionError(
        "chat: the model has no supported chat template");
  }
  if (absl::Status s = ValidateRoles(messages); !s.ok()) return s;
  const bool is_template =
      Contains(default_system, "{%") || Contains(default_system, "{{");
  const std::string system =
      is_template ? ExtractDefaultSystemPrompt(default_system) : default_system;
  switch (format) {
    case ChatFormat::kChatML:
      return RenderChatMl(messages, add_generation_prompt, system);
    case ChatFormat::kLlama3:
      return RenderLlama3(messages, add_generation_prompt, system);
    case ChatFormat::kLlama2:
      return RenderLlama2(messages, system);
    case ChatFormat::kNone:
      break;
  }
  return absl::FailedPreconditionError("chat: unknown chat format");
}

absl::StatusOr<std::string> RenderChat(ChatFormat format,
                                       const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt,
                                       const std::string& default_system) {
  absl::StatusOr<RenderedChat> parts =
      RenderChatParts(format, messages, add_generation_prompt, default_system);
  if (!parts.ok()) return parts.status();
  return std::move(parts->text);
}

}  // namespace kvserve::models
