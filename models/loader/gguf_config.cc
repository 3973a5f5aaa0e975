#include "models/loader/gguf_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvserve::models {
namespace {

// Control tokens that end a turn or the text in common chat vocabularies.
constexpr std::array<std::string_view, 10> kEndOfGenerationTokens = {
    "<|im_end|>",    "<|eot_id|>",
    "<|eom_id|>",    "<|end_of_text|>",
    "<|endoftext|>", "</s>",
    "<|end|>",       "<end_of_turn>",
    "<EOT>",         "<|end▁of▁sentence|>"};

absl::Status BadValue(const GgufFile& f, std::string_view key,
                      std::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      f.path(), ": metadata key '", std::string(key), "' ", std::string(why)));
}

// An int metadata value that must lie in [lo, INT32_MAX].
absl::StatusOr<int> ToInt(const GgufFile& f, std::string_view key, int64_t v,
                          int64_t lo) {
  if (v < lo || v > std::numeric_limits<int32_t>::max()) {
    return BadValue(f, key, absl::StrCat("= ", v, " is out of range"));
  }
  return static_cast<int>(v);
}

absl::StatusOr<int> RequiredInt(const GgufFile& f, const std::string& key) {
  KV_ASSIGN_OR_RETURN(const int64_t v, f.GetInt(key));
  return ToInt(f, key, v, 1);
}

absl::StatusOr<int> OptionalInt(const GgufFile& f, const std::string& key,
                                int fallback) {
  KV_ASSIGN_OR_RETURN(const int64_t v, f.GetIntOr(key, fallback));
  return ToInt(f, key, v, 0);
}

absl::StatusOr<float> PositiveFloat(const GgufFile& f, const std::string& key,
                                    double fallback) {
  KV_ASSIGN_OR_RETURN(const double v, f.GetFloatOr(key, fallback));
  if (!(v > 0) || !std::isfinite(v)) {
    return BadValue(f, key, absl::StrCat("= ", v, " must be > 0"));
  }
  return static_cast<float>(v);
}

absl::Status ReadRopeScaling(const GgufFile& f, const std::string& prefix,
                             ModelConfig* c) {
  const std::string type_key = prefix + "rope.scaling.type";
  KV_ASSIGN_OR_RETURN(std::string type, f.GetStringOr(type_key, "none"));
  // Older converters wrote only a linear scale.
  if (!f.Has(type_key) && f.Has(prefix + "rope.scale_linear")) type = "linear";
  if (type == "none" || type.empty()) return absl::OkStatus();
  if (type != "linear") {
    return BadValue(f, type_key,
                    absl::StrCat("= '", type, "' is not supported"));
  }
  c->rope_scaling.type = RopeScalingType::kLinear;
  const std::string factor_key = f.Has(prefix + "rope.scaling.factor")
                                     ? prefix + "rope.scaling.factor"
                                     : prefix + "rope.scale_linear";
  KV_ASSIGN_OR_RETURN(c->rope_scaling.factor,
                      PositiveFloat(f, factor_key, 1.0));
  KV_ASSIGN_OR_RETURN(
      c->rope_scaling.original_max_position,
      OptionalInt(f, prefix + "rope.scaling.original_context_length",
                  c->max_position));
  return absl::OkStatus();
}

absl::StatusOr<int> ReadVocabSize(const GgufFile& f,
                                  const std::string& prefix) {
  if (f.Has(prefix + "vocab_size"))
    return RequiredInt(f, prefix + "vocab_size");
  if (f.Has("tokenizer.ggml.tokens")) {
    KV_ASSIGN_OR_RETURN(const uint64_t n,
                        f.GetArrayLength("tokenizer.ggml.tokens"));
    return ToInt(f, "tokenizer.ggml.tokens", static_cast<int64_t>(n), 1);
  }
  return absl::NotFoundError(
      absl::StrCat(f.path(), ": missing metadata key '", prefix,
                   "vocab_size' and no tokenizer.ggml.tokens"));
}

absl::Status ReadShape(const GgufFile& f, const std::string& prefix,
                       ModelConfig* c) {
  KV_ASSIGN_OR_RETURN(c->num_layers, RequiredInt(f, prefix + "block_count"));
  KV_ASSIGN_OR_RETURN(c->hidden_size,
                      RequiredInt(f, prefix + "embedding_length"));
  KV_ASSIGN_OR_RETURN(c->intermediate_size,
                      RequiredInt(f, prefix + "feed_forward_length"));
  KV_ASSIGN_OR_RETURN(c->num_heads,
                      RequiredInt(f, prefix + "attention.head_count"));
  KV_ASSIGN_OR_RETURN(
      c->num_kv_heads,
      OptionalInt(f, prefix + "attention.head_count_kv", c->num_heads));
  KV_ASSIGN_OR_RETURN(c->max_position,
                      RequiredInt(f, prefix + "context_length"));
  if (f.Has(prefix + "attention.key_length")) {
    KV_ASSIGN_OR_RETURN(c->head_dim,
                        RequiredInt(f, prefix + "attention.key_length"));
  } else if (f.Has(prefix + "rope.dimension_count")) {
    KV_ASSIGN_OR_RETURN(c->head_dim,
                        RequiredInt(f, prefix + "rope.dimension_count"));
  } else if (c->hidden_size % c->num_heads == 0) {
    c->head_dim = c->hidden_size / c->num_heads;
  } else {
    return BadValue(
        f, prefix + "embedding_length",
        absl::StrCat("= ", c->hidden_size,
                     " is not a multiple of the head count ", c->num_heads));
  }
  KV_ASSIGN_OR_RETURN(c->vocab_size, ReadVocabSize(f, prefix));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& f) {
  ModelConfig c;
  KV_ASSIGN_OR_RETURN(c.architecture, f.GetString("general.architecture"));
  if (c.architecture != "llama" && c.architecture != "mistral" &&
      c.architecture != "qwen2") {
    return BadValue(f, "general.architecture",
                    absl::StrCat("= '", c.architecture,
                                 "' is not supported (llama, mistral, "
                                 "qwen2)"));
  }
  const std::string prefix = c.architecture + ".";
  KV_ASSIGN_OR_RETURN(c.name, f.GetStringOr("general.name", c.architecture));
  KV_RETURN_IF_ERROR(ReadShape(f, prefix, &c));
  KV_ASSIGN_OR_RETURN(c.rope_theta,
                      PositiveFloat(f, prefix + "rope.freq_base", 10000.0));
  KV_ASSIGN_OR_RETURN(
      c.rms_norm_eps,
      PositiveFloat(f, prefix + "attention.layer_norm_rms_epsilon", 1e-5));
  KV_RETURN_IF_ERROR(ReadRopeScaling(f, prefix, &c));
  KV_ASSIGN_OR_RETURN(c.sliding_window,
                      OptionalInt(f, prefix + "attention.sliding_window", 0));
  c.rope_style = c.architecture == "qwen2" ? RopeStyle::kHalfSplit
                                           : RopeStyle::kInterleaved;
  c.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  const GgufTensorInfo* q = f.FindTensor("blk.0.attn_q.weight");
  c.weight_dtype_bytes = q != nullptr && q->type == GgmlType::kF32 ? 4 : 2;
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.path(), ": ", valid.message()));
  }
  return c;
}

namespace {

absl::Status ReadTokenizerModel(const GgufFile& f, TokenizerData* t) {
  KV_ASSIGN_OR_RETURN(const std::string model,
                      f.GetString("tokenizer.ggml.model"));
  if (model == "gpt2") {
    t->model = TokenizerModel::kByteLevelBpe;
  } else if (model == "llama") {
    t->model = TokenizerModel::kSentencePieceBpe;
  } else {
    return BadValue(
        f, "tokenizer.ggml.model",
        absl::StrCat("= '", model, "' is not supported (gpt2, llama)"));
  }
  return absl::OkStatus();
}

absl::Status ReadVocab(const GgufFile& f, TokenizerData* t) {
  KV_ASSIGN_OR_RETURN(t->tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  const size_t n = t->tokens.size();
  if (n == 0 || n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return BadValue(f, "tokenizer.ggml.tokens", "has an invalid size");
  }
  if (f.Has("tokenizer.ggml.token_type")) {
    KV_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                        f.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != n) {
      return BadValue(
          f, "tokenizer.ggml.token_type",
          absl::StrCat("has ", types.size(), " entries for ", n, " tokens"));
    }
    t->token_types.reserve(n);
    for (int64_t v : types) {
      t->token_types.push_back(static_cast<TokenType>(v));
    }
  }
  if (f.Has("tokenizer.ggml.scores")) {
    KV_ASSIGN_OR_RETURN(const std::vector<double> scores,
                        f.GetFloatArray("tokenizer.ggml.scores"));
    if (scores.size() != n) {
      return BadValue(
          f, "tokenizer.ggml.scores",
          absl::StrCat("has ", scores.size(), " entries for ", n, " tokens"));
    }
    t->scores.assign(scores.begin(), scores.end());
  }
  if (f.Has("tokenizer.ggml.merges")) {
    KV_ASSIGN_OR_RETURN(t->merges, f.GetStringArray("tokenizer.ggml.merges"));
  } else if (t->model == TokenizerModel::kByteLevelBpe) {
    return absl::NotFoundError(absl::StrCat(
        f.path(), ": missing metadata key 'tokenizer.ggml.merges'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> TokenId(const GgufFile& f, const std::string& key,
                                int32_t fallback, size_t vocab) {
  KV_ASSIGN_OR_RETURN(const int64_t v, f.GetIntOr(key, fallback));
  if (v < -1 || v >= static_cast<int64_t>(vocab)) {
    return BadValue(f, key,
                    absl::StrCat("= ", v, " is outside the vocab of ", vocab));
  }
  return static_cast<int32_t>(v);
}

absl::Status ReadSpecialIds(const GgufFile& f, TokenizerData* t) {
  const bool spm = t->model == TokenizerModel::kSentencePieceBpe;
  const size_t n = t->tokens.size();
  KV_ASSIGN_OR_RETURN(
      t->bos_id, TokenId(f, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n));
  KV_ASSIGN_OR_RETURN(
      t->eos_id, TokenId(f, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n));
  KV_ASSIGN_OR_RETURN(t->unk_id, TokenId(f, "tokenizer.ggml.unknown_token_id",
                                         spm ? 0 : -1, n));
  KV_ASSIGN_OR_RETURN(t->pad_id,
                      TokenId(f, "tokenizer.ggml.padding_token_id", -1, n));
  KV_ASSIGN_OR_RETURN(t->add_bos,
                      f.GetBoolOr("tokenizer.ggml.add_bos_token", spm));
  KV_ASSIGN_OR_RETURN(t->add_eos,
                      f.GetBoolOr("tokenizer.ggml.add_eos_token", false));
  KV_ASSIGN_OR_RETURN(t->add_space_prefix,
                      f.GetBoolOr("tokenizer.ggml.add_space_prefix", spm));
  return absl::OkStatus();
}

void FindExtraEos(TokenizerData* t) {
  for (int32_t id = 0; id < static_cast<int32_t>(t->tokens.size()); ++id) {
    if (id == t->eos_id) continue;
    if (!t->token_types.empty() && t->token_types[id] != TokenType::kControl) {
      continue;
    }
    const std::string& tok = t->tokens[id];
    if (std::find(kEndOfGenerationTokens.begin(), kEndOfGenerationTokens.end(),
                  tok) != kEndOfGenerationTokens.end()) {
      t->extra_eos_ids.push_back(id);
    }
  }
}

}  // namespace

absl::StatusOr<TokenizerData> TokenizerDataFromGguf(const GgufFile& f) {
  TokenizerData t;
  KV_RETURN_IF_ERROR(ReadTokenizerModel(f, &t));
  KV_RETURN_IF_ERROR(ReadVocab(f, &t));
  KV_RETURN_IF_ERROR(ReadSpecialIds(f, &t));
  KV_ASSIGN_OR_RETURN(t.pre, f.GetStringOr("tokenizer.ggml.pre", "default"));
  KV_ASSIGN_OR_RETURN(t.chat_template,
                      f.GetStringOr("tokenizer.chat_template", ""));
  FindExtraEos(&t);
  return t;
}

}  // namespace kvserve::models
