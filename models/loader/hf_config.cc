#include "models/loader/hf_config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/loader/mapped_file.h"
#include "nlohmann/json.hpp"

namespace kvserve::models {
namespace {

using json = nlohmann::json;

// Typed, exception-free access to one JSON object, with errors naming the
// file and key. A null value counts as absent.
class Fields {
 public:
  Fields(const json& j, const std::string& origin, std::string prefix = "")
      : j_(j), origin_(origin), prefix_(std::move(prefix)) {}

  const json* Find(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::Status Error(const std::string& key, std::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(origin_, ": '", prefix_, key, "' ", std::string(why)));
  }

  // An integer in [lo, INT32_MAX]; `fallback` when absent (required if none).
  absl::StatusOr<int> Int(const std::string& key, std::optional<int> fallback,
                          int lo = 1) const {
    const json* v = Find(key);
    if (v == nullptr) {
      if (fallback.has_value()) return *fallback;
      return Error(key, "is missing");
    }
    if (!v->is_number_integer()) return Error(key, "is not an integer");
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > std::numeric_limits<int32_t>::max() ||
        (v->is_number_unsigned() &&
         v->get<uint64_t>() > std::numeric_limits<int32_t>::max())) {
      return Error(key, absl::StrCat("= ", v->dump(), " is out of range"));
    }
    return static_cast<int>(x);
  }

  // A finite number > 0; `fallback` when absent (required if none).
  absl::StatusOr<float> Positive(const std::string& key,
                                 std::optional<double> fallback) const {
    const json* v = Find(key);
    if (v == nullptr) {
      if (fallback.has_value()) return static_cast<float>(*fallback);
      return Error(key, "is missing");
    }
    if (!v->is_number()) return Error(key, "is not a number");
    const double x = v->get<double>();
    if (!(x > 0) || !std::isfinite(x)) {
      return Error(key, absl::StrCat("= ", v->dump(), " must be > 0"));
    }
    return static_cast<float>(x);
  }

  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return Error(key, "is not a boolean");
    return v->get<bool>();
  }

  absl::StatusOr<std::string> String(const std::string& key,
                                     std::string fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) return Error(key, "is not a string");
    return v->get<std::string>();
  }

 private:
  const json& j_;
  const std::string& origin_;
  std::string prefix_;
};

absl::Status ReadRopeScaling(const Fields& f, const std::string& origin,
                             ModelConfig* c) {
  const json* rs = f.Find("rope_scaling");
  if (rs == nullptr) return absl::OkStatus();
  if (!rs->is_object()) return f.Error("rope_scaling", "is not an object");
  const Fields s(*rs, origin, "rope_scaling.");
  KV_ASSIGN_OR_RETURN(std::string type, s.String("rope_type", ""));
  if (type.empty()) {
    KV_ASSIGN_OR_RETURN(type, s.String("type", ""));
  }
  RopeScaling& r = c->rope_scaling;
  if (type == "default" || type.empty()) {
    r.type = RopeScalingType::kNone;
  } else if (type == "linear") {
    r.type = RopeScalingType::kLinear;
    KV_ASSIGN_OR_RETURN(r.factor, s.Positive("factor", std::nullopt));
  } else if (type == "llama3") {
    r.type = RopeScalingType::kLlama3;
    KV_ASSIGN_OR_RETURN(r.factor, s.Positive("factor", std::nullopt));
    KV_ASSIGN_OR_RETURN(r.low_freq_factor,
                        s.Positive("low_freq_factor", std::nullopt));
    KV_ASSIGN_OR_RETURN(r.high_freq_factor,
                        s.Positive("high_freq_factor", std::nullopt));
    KV_ASSIGN_OR_RETURN(
        r.original_max_position,
        s.Int("original_max_position_embeddings", std::nullopt));
  } else {
    return s.Error(
        "rope_type",
        absl::StrCat("= '", type, "' is not supported (linear, llama3)"));
  }
  return absl::OkStatus();
}

absl::Status ReadShape(const Fields& f, ModelConfig* c) {
  KV_ASSIGN_OR_RETURN(c->num_layers, f.Int("num_hidden_layers", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->hidden_size, f.Int("hidden_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->num_heads, f.Int("num_attention_heads", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->num_kv_heads,
                      f.Int("num_key_value_heads", c->num_heads));
  if (f.Find("head_dim") != nullptr) {
    KV_ASSIGN_OR_RETURN(c->head_dim, f.Int("head_dim", std::nullopt));
  } else if (c->hidden_size % c->num_heads == 0) {
    c->head_dim = c->hidden_size / c->num_heads;
  } else {
    return f.Error("hidden_size", "is not a multiple of num_attention_heads");
  }
  KV_ASSIGN_OR_RETURN(c->intermediate_size,
                      f.Int("intermediate_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->vocab_size, f.Int("vocab_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->max_position,
                      f.Int("max_position_embeddings", std::nullopt));
  return absl::OkStatus();
}

absl::StatusOr<int> DtypeBytes(const Fields& f) {
  const std::string key =
      f.Find("torch_dtype") != nullptr ? "torch_dtype" : "dtype";
  KV_ASSIGN_OR_RETURN(const std::string dtype, f.String(key, "bfloat16"));
  if (dtype == "bfloat16" || dtype == "float16" || dtype == "half") return 2;
  if (dtype == "float32" || dtype == "float") return 4;
  return f.Error(key, absl::StrCat("= '", dtype, "' is not supported"));
}

absl::Status ReadOptions(const Fields& f, ModelConfig* c) {
  KV_ASSIGN_OR_RETURN(c->rope_theta, f.Positive("rope_theta", 10000.0));
  KV_ASSIGN_OR_RETURN(c->rms_norm_eps, f.Positive("rms_norm_eps", 1e-6));
  KV_ASSIGN_OR_RETURN(c->tied_embeddings, f.Bool("tie_word_embeddings", false));
  KV_ASSIGN_OR_RETURN(const bool use_window,
                      f.Bool("use_sliding_window", c->architecture != "qwen2"));
  KV_ASSIGN_OR_RETURN(const int window, f.Int("sliding_window", 0, 0));
  c->sliding_window = use_window ? window : 0;
  KV_ASSIGN_OR_RETURN(const bool attention_bias,
                      f.Bool("attention_bias", false));
  c->qkv_bias = c->architecture == "qwen2" || attention_bias;
  KV_ASSIGN_OR_RETURN(c->weight_dtype_bytes, DtypeBytes(f));
  c->rope_style = RopeStyle::kHalfSplit;
  return absl::OkStatus();
}

constexpr std::string_view kMlaArchitectures[] = {"DeepseekV2ForCausalLM",
                                                  "DeepseekV3ForCausalLM"};

bool IsMla(const json& j) {
  const auto rank = j.find("kv_lora_rank");
  if (rank != j.end() && rank->is_number_integer() &&
      rank->get<int64_t>() > 0) {
    return true;
  }
  const auto archs = j.find("architectures");
  if (archs != j.end() && archs->is_array()) {
    for (const json& a : *archs) {
      if (!a.is_string()) continue;
      for (std::string_view mla : kMlaArchitectures) {
        if (a.get<std::string>() == mla) return true;
      }
    }
  }
  const auto type = j.find("model_type");
  return type != j.end() && type->is_string() &&
         (*type == "deepseek_v2" || *type == "deepseek_v3");
}

std::string ArchitectureLabel(const json& j) {
  const auto archs = j.find("architectures");
  if (archs != j.end() && archs->is_array() && !archs->empty() &&
      archs->front().is_string()) {
    return archs->front().get<std::string>();
  }
  const auto type = j.find("model_type");
  return type != j.end() && type->is_string() ? type->get<std::string>()
                                              : "this model";
}

absl::Status ReadMlaShape(const Fields& f, ModelConfig* c) {
  KV_ASSIGN_OR_RETURN(c->num_layers, f.Int("num_hidden_layers", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->hidden_size, f.Int("hidden_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->num_heads, f.Int("num_attention_heads", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->num_kv_heads,
                      f.Int("num_key_value_heads", c->num_heads));
  KV_ASSIGN_OR_RETURN(c->intermediate_size,
                      f.Int("intermediate_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->vocab_size, f.Int("vocab_size", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->max_position,
                      f.Int("max_position_embeddings", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->kv_lora_rank, f.Int("kv_lora_rank", std::nullopt));
  KV_ASSIGN_OR_RETURN(c->qk_rope_head_dim,
                      f.Int("qk_rope_head_dim", std::nullopt, 0));
  KV_ASSIGN_OR_RETURN(c->qk_nope_head_dim,
                      f.Int("qk_nope_head_dim", std::nullopt, 0));
  KV_ASSIGN_OR_RETURN(c->v_head_dim, f.Int("v_head_dim", std::nullopt));
  c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
  KV_ASSIGN_OR_RETURN(c->tied_embeddings, f.Bool("tie_word_embeddings", false));
  KV_ASSIGN_OR_RETURN(c->weight_dtype_bytes, DtypeBytes(f));
  return absl::OkStatus();
}

absl::StatusOr<json> ParseObject(std::string_view json_text,
                                 const std::string& origin) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": not a valid JSON object"));
  }
  return j;
}

}  // namespace

bool IsMlaHfConfig(std::string_view json_text) {
  const json j = json::parse(json_text.begin(), json_text.end(), nullptr,
                             /*allow_exceptions=*/false);
  return !j.is_discarded() && j.is_object() && IsMla(j);
}

absl::StatusOr<ModelConfig> ParseHfSizingConfig(std::string_view json_text,
                                                const std::string& origin) {
  KV_ASSIGN_OR_RETURN(const json j, ParseObject(json_text, origin));
  if (!IsMla(j)) return ParseHfConfig(json_text, origin);
  const Fields f(j, origin);
  ModelConfig c;
  KV_ASSIGN_OR_RETURN(c.architecture, f.String("model_type", ""));
  KV_ASSIGN_OR_RETURN(c.name, f.String("_name_or_path", ""));
  KV_RETURN_IF_ERROR(ReadMlaShape(f, &c));
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": ", valid.message()));
  }
  return c;
}

absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text,
                                          const std::string& origin) {
  KV_ASSIGN_OR_RETURN(const json j, ParseObject(json_text, origin));
  if (IsMla(j)) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": ", ArchitectureLabel(j),
        " uses multi-head latent attention (MLA), which kvserve cannot load "
        "or serve (llama, mistral, qwen2 only); 'kvserve plan --model' sizes "
        "its KV cache from config.json"));
  }
  const Fields f(j, origin);
  ModelConfig c;
  KV_ASSIGN_OR_RETURN(c.architecture, f.String("model_type", ""));
  if (c.architecture != "llama" && c.architecture != "mistral" &&
      c.architecture != "qwen2") {
    return f.Error("model_type",
                   absl::StrCat("= '", c.architecture,
                                "' is not supported (llama, mistral, qwen2)"));
  }
  KV_ASSIGN_OR_RETURN(c.name, f.String("_name_or_path", ""));
  KV_RETURN_IF_ERROR(ReadShape(f, &c));
  KV_RETURN_IF_ERROR(ReadOptions(f, &c));
  KV_RETURN_IF_ERROR(ReadRopeScaling(f, origin, &c));
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": ", valid.message()));
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& config_path) {
  KV_ASSIGN_OR_RETURN(const std::string text, ReadFileToString(config_path));
  KV_ASSIGN_OR_RETURN(ModelConfig c, ParseHfConfig(text, config_path));
  if (c.name.empty()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path abs = fs::absolute(fs::path(config_path), ec);
    c.name =
        (ec ? fs::path(config_path) : abs).parent_path().filename().string();
  }
  return c;
}

}  // namespace kvserve::models
