#include "models/tokenizer/tokenizer_json.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/tokenizer/pretokenizer.h"
#include "nlohmann/json.hpp"

namespace kvserve::models {
namespace {

using json = nlohmann::json;

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"
// The tokenizer.json spellings of the Llama-3 and Qwen2 split patterns.
constexpr std::string_view kHfLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kHfQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kWholeTextRegex = R"([\s\S]+)";

constexpr std::array<std::string_view, 10> kEndOfGenerationTokens = {
    "<|im_end|>",    "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>",
    "<|endoftext|>", "</s>",       "<|end|>",    "<end_of_turn>",
    "<EOT>",         "<eos>"};
constexpr std::array<std::string_view, 5> kBosTokens = {
    "<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "<|im_start|>"};

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "tokenizer.json: ", std::string(field), " ", std::string(why)));
}

absl::Status Unsupported(std::string_view field, std::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: ", std::string(field), " ",
                   std::string(what), " is not supported"));
}

// The member `key` of object `j`, or nullptr when absent or null.
const json* Member(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string StringOr(const json& j, const char* key, std::string fallback) {
  const json* m = Member(j, key);
  if (m != nullptr && m->is_string()) return m->get<std::string>();
  return fallback;
}

bool BoolOr(const json& j, const char* key, bool fallback) {
  const json* m = Member(j, key);
  return m != nullptr && m->is_boolean() ? m->get<bool>() : fallback;
}

// The steps of a pipeline element: the members of a Sequence (under
// `list_key`), or the element itself.
std::vector<const json*> Steps(const json* j, const char* list_key) {
  std::vector<const json*> steps;
  if (j == nullptr) return steps;
  const json* list = Member(*j, list_key);
  if (StringOr(*j, "type", "") == "Sequence" && list != nullptr &&
      list->is_array()) {
    for (const json& s : *list) steps.push_back(&s);
  } else {
    steps.push_back(j);
  }
  return steps;
}

bool HasStep(const json* j, const char* list_key, std::string_view type) {
  for (const json* s : Steps(j, list_key)) {
    if (StringOr(*s, "type", "") == type) return true;
  }
  return false;
}

// A Replace step's pattern string ({"String": s}), or "".
std::string ReplacePattern(const json& step) {
  const json* pattern = Member(step, "pattern");
  return pattern != nullptr ? StringOr(*pattern, "String", "") : "";
}

bool HasReplace(const json* j, const char* list_key, std::string_view from,
                std::string_view to) {
  for (const json* s : Steps(j, list_key)) {
    if (StringOr(*s, "type", "") == "Replace" && ReplacePattern(*s) == from &&
        StringOr(*s, "content", "") == to) {
      return true;
    }
  }
  return false;
}

absl::Status ReadVocab(const json& model, TokenizerData* t) {
  const json* vocab = Member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object() || vocab->empty()) {
    return Bad("model.vocab", "must be a non-empty object");
  }
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() >= (int64_t{1} << 30)) {
      return Bad(absl::StrCat("model.vocab[\"", token, "\"]"),
                 "must be a non-negative integer id");
    }
    const size_t i = id.get<size_t>();
    if (i >= t->tokens.size()) t->tokens.resize(i + 1);
    t->tokens[i] = token;
  }
  return absl::OkStatus();
}

absl::Status ReadMerges(const json& model, TokenizerData* t) {
  const json* merges = Member(model, "merges");
  if (merges == nullptr) return absl::OkStatus();
  if (!merges->is_array()) return Bad("model.merges", "must be an array");
  t->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& m = (*merges)[i];
    const std::string field = absl::StrCat("model.merges[", i, "]");
    if (m.is_string()) {
      t->merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {
      const std::string a = m[0].get<std::string>();
      const std::string b = m[1].get<std::string>();
      if (a.find(' ') != std::string::npos) {
        return Unsupported(field, "with a space inside a token");
      }
      t->merges.push_back(absl::StrCat(a, " ", b));
    } else {
      return Bad(field, "must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  return absl::OkStatus();
}

absl::Status ReadAddedTokens(const json& root, TokenizerData* t) {
  const json* added = Member(root, "added_tokens");
  if (added == nullptr) return absl::OkStatus();
  if (!added->is_array()) return Bad("added_tokens", "must be an array");
  for (size_t i = 0; i < added->size(); ++i) {
    const json& a = (*added)[i];
    const json* id = Member(a, "id");
    const json* content = Member(a, "content");
    if (id == nullptr || !id->is_number_integer() || id->get<int64_t>() < 0 ||
        id->get<int64_t>() >= (int64_t{1} << 30) || content == nullptr ||
        !content->is_string()) {
      return Bad(absl::StrCat("added_tokens[", i, "]"),
                 "needs an integer id and a string content");
    }
    const size_t index = id->get<size_t>();
    if (index >= t->tokens.size()) {
      t->tokens.resize(index + 1);
      t->token_types.resize(index + 1, TokenType::kUnused);
    }
    t->tokens[index] = content->get<std::string>();
    t->token_types[index] = BoolOr(a, "special", false)
                                ? TokenType::kControl
                                : TokenType::kUserDefined;
  }
  return absl::OkStatus();
}

// Byte-level pre-tokenizer steps -> regexes (llama.cpp's list semantics).
absl::Status ReadByteLevelPre(const json* pre, TokenizerData* t) {
  std::vector<std::string>& regexes = t->pre_regexes;
  const std::vector<const json*> steps = Steps(pre, "pretokenizers");
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = *steps[i];
    const std::string type = StringOr(s, "type", "");
    const std::string field = absl::StrCat("pre_tokenizer step ", i);
    if (type == "ByteLevel") {
      if (BoolOr(s, "add_prefix_space", false)) {
        return Unsupported(field, "ByteLevel add_prefix_space=true");
      }
      if (BoolOr(s, "use_regex", true)) regexes.emplace_back(kGpt2Regex);
    } else if (type == "Digits") {
      regexes.emplace_back(BoolOr(s, "individual_digits", false) ? R"(\p{N})"
                                                                 : R"(\p{N}+)");
    } else if (type == "Split") {
      const json* pattern = Member(s, "pattern");
      if (StringOr(s, "behavior", "") != "Isolated" ||
          BoolOr(s, "invert", false) || pattern == nullptr) {
        return Unsupported(field, "Split other than behavior Isolated");
      }
      if (const std::string r = StringOr(*pattern, "Regex", ""); !r.empty()) {
        regexes.push_back(r);
      } else if (const std::string str = StringOr(*pattern, "String", "");
                 !str.empty()) {
        regexes.push_back(absl::StrCat("\\Q", str, "\\E"));
      } else {
        return Bad(field, "Split needs pattern.Regex or pattern.String");
      }
    } else {
      return Unsupported(field, absl::StrCat("type '", type, "'"));
    }
  }
  if (regexes.empty()) regexes.emplace_back(kWholeTextRegex);
  const std::vector<std::string> gpt2 = {std::string(kGpt2Regex)};
  const std::vector<std::string> smollm = {R"(\p{N})", std::string(kGpt2Regex)};
  if (regexes == gpt2) {
    t->pre = "gpt2";
  } else if (regexes == smollm) {
    t->pre = "smollm";
  } else if (regexes.size() == 1 && regexes[0] == kHfLlama3Regex) {
    t->pre = "llama-bpe";
  } else if (regexes.size() == 1 && regexes[0] == kHfQwen2Regex) {
    t->pre = "qwen2";
  } else {
    t->pre = "custom";
  }
  return absl::OkStatus();
}

absl::Status ReadSpmPipeline(const json& root, TokenizerData* t) {
  const json* pre = Member(root, "pre_tokenizer");
  const json* norm = Member(root, "normalizer");
  if (pre != nullptr) {
    if (StringOr(*pre, "type", "") != "Metaspace") {
      return Unsupported("pre_tokenizer.type",
                         absl::StrCat("'", StringOr(*pre, "type", ""),
                                      "' with a SentencePiece model"));
    }
    if (StringOr(*pre, "replacement", std::string(kSpmSpace)) != kSpmSpace) {
      return Unsupported("pre_tokenizer.replacement", "other than U+2581");
    }
    if (BoolOr(*pre, "split", true)) {
      return Unsupported("pre_tokenizer.split", "true");
    }
    std::string scheme = StringOr(*pre, "prepend_scheme", "");
    if (scheme.empty()) {
      scheme = BoolOr(*pre, "add_prefix_space", true) ? "always" : "never";
    }
    t->add_space_prefix = scheme != "never";
    t->pre = scheme == "first" ? "metaspace-first" : "metaspace";
    return absl::OkStatus();
  }
  if (!HasReplace(norm, "normalizers", " ", kSpmSpace)) {
    return Unsupported("normalizer",
                       "without Replace(\" \", \"\\u2581\") for a "
                       "SentencePiece model");
  }
  t->pre = "llama";
  t->add_space_prefix = false;
  for (const json* s : Steps(norm, "normalizers")) {
    if (StringOr(*s, "type", "") == "Prepend" &&
        StringOr(*s, "prepend", "") == kSpmSpace) {
      t->add_space_prefix = true;
    }
  }
  return absl::OkStatus();
}

int32_t FindToken(const TokenizerData& t, std::string_view text) {
  const auto it = std::find(t.tokens.begin(), t.tokens.end(), text);
  return it == t.tokens.end() ? -1
                              : static_cast<int32_t>(it - t.tokens.begin());
}

// The special token of a TemplateProcessing piece, or "".
std::string SpecialTokenOf(const json& piece) {
  const json* special = Member(piece, "SpecialToken");
  return special != nullptr ? StringOr(*special, "id", "") : "";
}

void ReadSpecialIds(const json& root, TokenizerData* t) {
  for (const json* p : Steps(Member(root, "post_processor"), "processors")) {
    const json* single = Member(*p, "single");
    if (StringOr(*p, "type", "") != "TemplateProcessing" || single == nullptr ||
        !single->is_array() || single->empty()) {
      continue;
    }
    if (const int32_t bos = FindToken(*t, SpecialTokenOf(single->front()));
        bos >= 0) {
      t->bos_id = bos;
      t->add_bos = true;
    }
    if (const int32_t eos = FindToken(*t, SpecialTokenOf(single->back()));
        eos >= 0 && single->size() > 1) {
      t->eos_id = eos;
      t->add_eos = true;
    }
  }
  for (std::string_view name : kBosTokens) {
    if (t->bos_id >= 0) break;
    t->bos_id = FindToken(*t, name);
  }
  for (std::string_view name : kEndOfGenerationTokens) {
    if (t->eos_id >= 0) break;
    t->eos_id = FindToken(*t, name);
  }
}

void FindExtraEos(TokenizerData* t) {
  t->extra_eos_ids.clear();
  for (std::string_view name : kEndOfGenerationTokens) {
    const int32_t id = FindToken(*t, name);
    if (id >= 0 && id != t->eos_id &&
        t->token_types[id] == TokenType::kControl) {
      t->extra_eos_ids.push_back(id);
    }
  }
}

absl::Status ReadModel(const json& model, TokenizerData* t) {
  const std::string type = StringOr(model, "type", "BPE");
  if (type != "BPE") {
    return Unsupported("model.type", absl::StrCat("'", type, "'"));
  }
  KV_RETURN_IF_ERROR(ReadVocab(model, t));
  KV_RETURN_IF_ERROR(ReadMerges(model, t));
  t->ignore_merges = BoolOr(model, "ignore_merges", false);
  return absl::OkStatus();
}

// Token types, unk id, and the kind-specific pipeline.
absl::Status ReadPipeline(const json& root, const json& model,
                          TokenizerData* t) {
  const json* pre = Member(root, "pre_tokenizer");
  const json* decoder = Member(root, "decoder");
  const bool byte_level = HasStep(pre, "pretokenizers", "ByteLevel") ||
                          HasStep(decoder, "decoders", "ByteLevel");
  const bool byte_fallback = BoolOr(model, "byte_fallback", false);
  t->token_types.resize(t->tokens.size(), TokenType::kNormal);
  for (size_t id = 0; id < t->tokens.size(); ++id) {
    if (t->tokens[id].empty()) t->token_types[id] = TokenType::kUnused;
    const std::string& s = t->tokens[id];
    if (!byte_level && byte_fallback && s.size() == 6 && s.starts_with("<0x") &&
        s.back() == '>' && t->token_types[id] == TokenType::kNormal) {
      t->token_types[id] = TokenType::kByte;
    }
  }
  if (const std::string unk = StringOr(model, "unk_token", ""); !unk.empty()) {
    t->unk_id = FindToken(*t, unk);
    if (t->unk_id >= 0 && t->token_types[t->unk_id] == TokenType::kNormal) {
      t->token_types[t->unk_id] = TokenType::kUnknown;
    }
  }
  if (byte_level) {
    t->model = TokenizerModel::kByteLevelBpe;
    return ReadByteLevelPre(pre, t);
  }
  t->model = TokenizerModel::kSentencePieceBpe;
  return ReadSpmPipeline(root, t);
}

bool ReadWholeFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  *out = text.str();
  return true;
}

absl::Status WithPath(const std::string& path, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

absl::StatusOr<json> ParseObject(std::string_view text, std::string_view what) {
  json root = json::parse(text.begin(), text.end(), nullptr, false);
  if (root.is_discarded() || !root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": not a JSON object"));
  }
  return root;
}

}  // namespace

absl::StatusOr<TokenizerData> TokenizerDataFromJson(
    std::string_view json_text) {
  KV_ASSIGN_OR_RETURN(const json root,
                      ParseObject(json_text, "tokenizer.json"));
  const json* model = Member(root, "model");
  if (model == nullptr || !model->is_object()) {
    return Bad("model", "must be an object");
  }
  TokenizerData t;
  KV_RETURN_IF_ERROR(ReadModel(*model, &t));
  t.token_types.resize(t.tokens.size(), TokenType::kNormal);
  KV_RETURN_IF_ERROR(ReadAddedTokens(root, &t));
  KV_RETURN_IF_ERROR(ReadPipeline(root, *model, &t));
  ReadSpecialIds(root, &t);
  FindExtraEos(&t);
  return t;
}

absl::StatusOr<TokenizerData> ReadTokenizerJson(const std::string& path) {
  std::string text;
  if (!ReadWholeFile(path, &text)) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot read"));
  }
  absl::StatusOr<TokenizerData> data = TokenizerDataFromJson(text);
  if (!data.ok()) return WithPath(path, data.status());
  const std::string config_path =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json")
          .string();
  if (ReadWholeFile(config_path, &text)) {
    if (absl::Status s = ApplyTokenizerConfig(text, &*data); !s.ok()) {
      return WithPath(config_path, s);
    }
  }
  return data;
}

namespace {

// bos_token etc.: a string or {"content": ...}; "" when absent or null.
std::string ConfigToken(const json& config, const char* key) {
  const json* j = Member(config, key);
  if (j == nullptr) return "";
  if (j->is_string()) return j->get<std::string>();
  return StringOr(*j, "content", "");
}

}  // namespace

absl::Status ApplyTokenizerConfig(std::string_view json_text,
                                  TokenizerData* data) {
  KV_ASSIGN_OR_RETURN(const json config,
                      ParseObject(json_text, "tokenizer_config.json"));
  const std::pair<const char*, int32_t*> ids[] = {{"bos_token", &data->bos_id},
                                                  {"eos_token", &data->eos_id},
                                                  {"unk_token", &data->unk_id},
                                                  {"pad_token", &data->pad_id}};
  for (const auto& [key, id] : ids) {
    const std::string token = ConfigToken(config, key);
    if (token.empty()) continue;
    const int32_t found = FindToken(*data, token);
    if (found < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer_config.json: ", key, " '", token,
                       "' is not in the vocab"));
    }
    *id = found;
  }
  data->add_bos = BoolOr(config, "add_bos_token", data->add_bos);
  data->add_eos = BoolOr(config, "add_eos_token", data->add_eos);
  if (const json* tmpl = Member(config, "chat_template"); tmpl != nullptr) {
    if (tmpl->is_string()) {
      data->chat_template = tmpl->get<std::string>();
    } else if (tmpl->is_array()) {
      for (const json& named : *tmpl) {
        if (StringOr(named, "name", "") == "default") {
          data->chat_template = StringOr(named, "template", "");
        }
      }
    }
  }
  if (data->token_types.size() == data->tokens.size()) FindExtraEos(data);
  return absl::OkStatus();
}

}  // namespace kvserve::models
