#include "models/loader/presets.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_join.h"
#include "common/check.h"

namespace kvserve::models {
namespace {

// Llama 3.1 / 3.2 `rope_scaling` (rope_type "llama3"); 3.2 differs only in
// the factor (32; 3.1 has 8: never hard-code it).
RopeScaling Llama3Scaling(float factor) {
  return {.type = RopeScalingType::kLlama3,
          .factor = factor,
          .low_freq_factor = 1.0f,
          .high_freq_factor = 4.0f,
          .original_max_position = 8192};
}

void AddLlama2(std::vector<ModelPreset>& out) {
  struct Row {
    const char *name, *size;
    int layers, hidden, heads, kv_heads, inter;
  };
  // Llama 2: float16 checkpoints, no rope_theta key (transformers default
  // 10000), max_pos 4096. 7B/13B are MHA; 70B is GQA with 8 KV heads.
  for (const Row& r : {Row{"llama2-7b", "7b", 32, 4096, 32, 32, 11008},
                       Row{"llama2-13b", "13b", 40, 5120, 40, 40, 13824},
                       Row{"llama2-70b", "70b", 80, 8192, 64, 8, 28672}}) {
    const std::string size = r.size;
    out.push_back({.name = r.name,
                   .hf_repo = "meta-llama/Llama-2-" + size + "-hf",
                   .alt_hf_repos = {"meta-llama/Llama-2-" + size + "-chat-hf"},
                   .gguf_patterns = {"llama-2-" + size, "llama2-" + size},
                   .config = {.name = r.name,
                              .architecture = "llama",
                              .num_layers = r.layers,
                              .hidden_size = r.hidden,
                              .num_heads = r.heads,
                              .num_kv_heads = r.kv_heads,
                              .head_dim = 128,
                              .intermediate_size = r.inter,
                              .vocab_size = 32000,
                              .max_position = 4096,
                              .rope_theta = 10000.0f,
                              .rms_norm_eps = 1e-5f,
                              .rope_scaling = {}},
                   .chat_format = ChatFormat::kLlama2});
  }
}

void AddLlama3(std::vector<ModelPreset>& out) {
  struct Row {
    const char *name, *repo_name, *pattern;
    int layers, hidden, heads, kv_heads, head_dim, inter, max_pos;
    float rope_factor;  // 0 = no rope scaling
    bool tied;
  };
  // Llama 3 / 3.1 / 3.2: bf16, vocab 128256, rope_theta 500000.
  const Row rows[] = {
      {"llama3-8b", "Meta-Llama-3-8B", "llama-3-8b", 32, 4096, 32, 8, 128,
       14336, 8192, 0, false},
      {"llama3-70b", "Meta-Llama-3-70B", "llama-3-70b", 80, 8192, 64, 8, 128,
       28672, 8192, 0, false},
      {"llama3.1-8b", "Llama-3.1-8B", "llama-3.1-8b", 32, 4096, 32, 8, 128,
       14336, 131072, 8, false},
      {"llama3.1-70b", "Llama-3.1-70B", "llama-3.1-70b", 80, 8192, 64, 8, 128,
       28672, 131072, 8, false},
      {"llama3.1-405b", "Llama-3.1-405B", "llama-3.1-405b", 126, 16384, 128, 8,
       128, 53248, 131072, 8, false},
      {"llama3.2-1b", "Llama-3.2-1B", "llama-3.2-1b", 16, 2048, 32, 8, 64, 8192,
       131072, 32, true},
      {"llama3.2-3b", "Llama-3.2-3B", "llama-3.2-3b", 28, 3072, 24, 8, 128,
       8192, 131072, 32, true},
  };
  for (const Row& r : rows) {
    const std::string repo = std::string("meta-llama/") + r.repo_name;
    std::vector<std::string> alts = {repo + "-Instruct"};
    if (r.rope_factor == 8) {  // Llama 3.1 repos were renamed from Meta-*.
      const std::string old = std::string("meta-llama/Meta-") + r.repo_name;
      alts.push_back(old);
      alts.push_back(old + "-Instruct");
    }
    out.push_back({.name = r.name,
                   .hf_repo = repo,
                   .alt_hf_repos = std::move(alts),
                   .gguf_patterns = {r.pattern},
                   .config = {.name = r.name,
                              .architecture = "llama",
                              .num_layers = r.layers,
                              .hidden_size = r.hidden,
                              .num_heads = r.heads,
                              .num_kv_heads = r.kv_heads,
                              .head_dim = r.head_dim,
                              .intermediate_size = r.inter,
                              .vocab_size = 128256,
                              .max_position = r.max_pos,
                              .rope_theta = 500000.0f,
                              .rms_norm_eps = 1e-5f,
                              .rope_scaling = r.rope_factor > 0
                                                  ? Llama3Scaling(r.rope_factor)
                                                  : RopeScaling{},
                              .tied_embeddings = r.tied},
                   .chat_format = ChatFormat::kLlama3});
  }
}

void AddMistral(std::vector<ModelPreset>& out) {
  ModelConfig v01 = {.name = "mistral-7b",
                     .architecture = "mistral",
                     .num_layers = 32,
                     .hidden_size = 4096,
                     .num_heads = 32,
                     .num_kv_heads = 8,
                     .head_dim = 128,
                     .intermediate_size = 14336,
                     .vocab_size = 32000,
                     .max_position = 32768,
                     .rope_theta = 10000.0f,
                     .rms_norm_eps = 1e-5f,
                     .rope_scaling = {},
                     .sliding_window = 4096};
  // v0.3: full attention, vocab 32768, rope_theta 1e6.
  ModelConfig v03 = v01;
  v03.name = "mistral-7b-v0.3";
  v03.vocab_size = 32768;
  v03.rope_theta = 1000000.0f;
  v03.sliding_window = 0;
  out.push_back(
      {.name = "mistral-7b",
       .aliases = {"mistral-7b-v0.1"},
       .hf_repo = "mistralai/Mistral-7B-v0.1",
       .alt_hf_repos = {"mistralai/Mistral-7B-Instruct-v0.1"},
       .gguf_patterns = {"mistral-7b-v0.1", "mistral-7b-instruct-v0.1"},
       .config = v01});
  out.push_back(
      {.name = "mistral-7b-v0.3",
       .hf_repo = "mistralai/Mistral-7B-Instruct-v0.3",
       .alt_hf_repos = {"mistralai/Mistral-7B-v0.3"},
       .gguf_patterns = {"mistral-7b-v0.3", "mistral-7b-instruct-v0.3"},
       .config = v03});
}

void AddQwen25(std::vector<ModelPreset>& out) {
  struct Row {
    const char *name, *repo;
    int layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_pos;
    float eps;
    bool tied;
  };
  // Qwen2.5 base checkpoints: q/k/v biases, rope_theta 1e6, full attention
  // (use_sliding_window is false).
  const Row rows[] = {
      {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", 24, 896, 14, 2, 64, 4864, 151936,
       32768, 1e-6f, true},
      {"qwen2.5-7b", "Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064,
       131072, 1e-6f, false},
      {"qwen2.5-72b", "Qwen/Qwen2.5-72B", 80, 8192, 64, 8, 128, 29568, 152064,
       131072, 1e-5f, false},
  };
  for (const Row& r : rows) {
    out.push_back({.name = r.name,
                   .hf_repo = r.repo,
                   .alt_hf_repos = {std::string(r.repo) + "-Instruct"},
                   .gguf_patterns = {r.name},
                   .config = {.name = r.name,
                              .architecture = "qwen2",
                              .num_layers = r.layers,
                              .hidden_size = r.hidden,
                              .num_heads = r.heads,
                              .num_kv_heads = r.kv_heads,
                              .head_dim = r.head_dim,
                              .intermediate_size = r.inter,
                              .vocab_size = r.vocab,
                              .max_position = r.max_pos,
                              .rope_theta = 1000000.0f,
                              .rms_norm_eps = r.eps,
                              .rope_scaling = {},
                              .tied_embeddings = r.tied,
                              .qkv_bias = true},
                   .chat_format = ChatFormat::kChatML});
  }
}

void AddSmallLlamas(std::vector<ModelPreset>& out) {
  struct Row {
    const char *name, *repo;
    int layers, hidden, heads, kv_heads, inter;
    float theta;
  };
  // SmolLM2: tied embeddings, vocab 49152, max_pos 8192, head_dim 64.
  const Row rows[] = {
      {"smollm2-135m", "HuggingFaceTB/SmolLM2-135M", 30, 576, 9, 3, 1536,
       100000.0f},
      {"smollm2-360m", "HuggingFaceTB/SmolLM2-360M", 32, 960, 15, 5, 2560,
       100000.0f},
      {"smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B", 24, 2048, 32, 32, 8192,
       130000.0f},
  };
  const size_t smollm2_135m = out.size();
  for (const Row& r : rows) {
    out.push_back({.name = r.name,
                   .hf_repo = r.repo,
                   .alt_hf_repos = {std::string(r.repo) + "-Instruct"},
                   .gguf_patterns = {r.name},
                   .config = {.name = r.name,
                              .architecture = "llama",
                              .num_layers = r.layers,
                              .hidden_size = r.hidden,
                              .num_heads = r.heads,
                              .num_kv_heads = r.kv_heads,
                              .head_dim = 64,
                              .intermediate_size = r.inter,
                              .vocab_size = 49152,
                              .max_position = 8192,
                              .rope_theta = r.theta,
                              .rms_norm_eps = 1e-5f,
                              .rope_scaling = {},
                              .tied_embeddings = true},
                   .chat_format = ChatFormat::kChatML});
  }
  // The embedded default model (deploy/setup.sh puts it in weights/).
  out[smollm2_135m].file_names = {"SmolLM2-135M-Instruct.Q4_1.gguf"};
  out[smollm2_135m].aliases = {"smollm2"};
  out.push_back(
      {.name = "tinyllama-1.1b",
       .aliases = {"tinyllama"},
       .hf_repo = "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
       .alt_hf_repos = {"TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"},
       .gguf_patterns = {"tinyllama-1.1b"},
       .config = {.name = "tinyllama-1.1b",
                  .architecture = "llama",
                  .num_layers = 22,
                  .hidden_size = 2048,
                  .num_heads = 32,
                  .num_kv_heads = 4,
                  .head_dim = 64,
                  .intermediate_size = 5632,
                  .vocab_size = 32000,
                  .max_position = 2048,
                  .rope_theta = 10000.0f,
                  .rms_norm_eps = 1e-5f,
                  .rope_scaling = {}}});
}

std::vector<ModelPreset> BuildPresets() {
  std::vector<ModelPreset> presets;
  AddLlama2(presets);
  AddLlama3(presets);
  AddMistral(presets);
  AddQwen25(presets);
  AddSmallLlamas(presets);
  for (ModelPreset& p : presets) {
    p.config.rope_style = RopeStyle::kHalfSplit;  // HF convention
    p.config.weight_dtype_bytes = 2;              // bf16 / fp16 checkpoints
    const absl::Status valid = p.config.Validate();
    KV_CHECK(valid.ok(), "", valid.ToString());
  }
  return presets;
}

std::string StripVariantSuffix(std::string key) {
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (std::string_view suffix : {"instruct", "chat", "hf", "base"}) {
      if (key.size() > suffix.size() && key.ends_with(suffix)) {
        key.resize(key.size() - suffix.size());
        stripped = true;
      }
    }
  }
  return key;
}

// Normalized name -> index into ListPresets(). Keys: name, aliases, HF repo
// ids and repo names. KV_CHECKs that no key names two presets.
const absl::flat_hash_map<std::string, size_t>& PresetIndex() {
  static const auto* index = [] {
    auto* m = new absl::flat_hash_map<std::string, size_t>();
    const std::vector<ModelPreset>& presets = ListPresets();
    for (size_t i = 0; i < presets.size(); ++i) {
      std::vector<std::string> names = presets[i].aliases;
      names.push_back(presets[i].name);
      for (const std::string& repo : presets[i].AllHfRepos()) {
        names.push_back(repo);
        names.push_back(repo.substr(repo.find('/') + 1));
      }
      for (const std::string& n : names) {
        auto [it, inserted] = m->emplace(NormalizeModelName(n), i);
        KV_CHECK(inserted || it->second == i, "preset key '", n,
                 "' names two presets");
      }
    }
    return m;
  }();
  return *index;
}

}  // namespace

std::vector<std::string> ModelPreset::AllHfRepos() const {
  std::vector<std::string> repos = {hf_repo};
  repos.insert(repos.end(), alt_hf_repos.begin(), alt_hf_repos.end());
  return repos;
}

bool ModelPreset::MatchesGgufFileName(std::string_view file_name) const {
  std::string lower(file_name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (!lower.ends_with(".gguf")) return false;
  const std::string norm = NormalizeModelName(file_name);
  return std::any_of(gguf_patterns.begin(), gguf_patterns.end(),
                     [&](const std::string& pattern) {
                       return norm.find(NormalizeModelName(pattern)) !=
                              std::string::npos;
                     });
}

const std::vector<ModelPreset>& ListPresets() {
  static const auto* presets = new std::vector<ModelPreset>(BuildPresets());
  return *presets;
}

const ModelPreset* FindPreset(std::string_view name) {
  const auto& index = PresetIndex();
  const std::string key = NormalizeModelName(name);
  if (key.empty()) return nullptr;
  auto it = index.find(key);
  if (it == index.end()) it = index.find(StripVariantSuffix(key));
  if (it == index.end()) return nullptr;
  return &ListPresets()[it->second];
}

std::string PresetNames() {
  return absl::StrJoin(
      ListPresets(), ", ",
      [](std::string* out, const ModelPreset& p) { out->append(p.name); });
}

std::string NormalizeModelName(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (char c : name) {
    if (c == '-' || c == '_' || c == '.' || c == ' ') continue;
    out.push_back(
        static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

int64_t EstimateParameterCount(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  int64_t per_layer = h * q_dim + 2 * h * kv_dim + q_dim * h  // q, k, v, o
                      + 3 * h * c.intermediate_size           // gate, up, down
                      + 2 * h;                                // two RMSNorms
  if (c.qkv_bias) per_layer += q_dim + 2 * kv_dim;
  const int64_t embeddings = int64_t{c.vocab_size} * h;
  return embeddings * (c.tied_embeddings ? 1 : 2) + c.num_layers * per_layer +
         h;  // final norm
}

kvcache::KvShape KvShapeOf(const ModelConfig& c) {
  return {.num_layers = c.num_layers,
          .num_kv_heads = c.num_kv_heads,
          .head_dim = c.head_dim,
          .kv_lora_rank = c.kv_lora_rank,
          .qk_rope_head_dim = c.qk_rope_head_dim};
}

}  // namespace kvserve::models
