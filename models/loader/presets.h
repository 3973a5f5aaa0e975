// Named model presets: the architecture numbers of well-known Llama-family
// checkpoints (as their published config.json files give them), their
// Hugging Face repo ids, and the file names that identify their weights on
// disk. Presets let `kvserve plan` size a model without its weights and let
// the model resolver find weights by name. This module reads no files; the
// search itself lives in model_resolver.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kvcache/kv_sizing.h"
#include "models/model_config.h"

namespace kvserve::models {

struct ModelPreset {
  // Canonical name, e.g. "llama3-70b"; also config.name.
  std::string name = {};
  // Extra names FindPreset accepts (besides the name and the HF repo names).
  std::vector<std::string> aliases = {};
  // Canonical HF repo id, e.g. "meta-llama/Meta-Llama-3-70B".
  std::string hf_repo = {};
  // Same-architecture variants (instruct/chat, renamed repos) that the
  // resolver also looks for in the HF cache and models directories.
  std::vector<std::string> alt_hf_repos = {};
  // Exact file names tried first in each models directory.
  std::vector<std::string> file_names = {};
  // A *.gguf file matches when its NormalizeModelName() contains the
  // normalized form of one of these.
  std::vector<std::string> gguf_patterns = {};
  ModelConfig config = {};
  // Prompt format of the instruct/chat variants (metadata in a file wins).
  ChatFormat chat_format = ChatFormat::kNone;

  // hf_repo followed by alt_hf_repos.
  [[nodiscard]] std::vector<std::string> AllHfRepos() const;
  // True if `file_name` ends in ".gguf" and matches a gguf pattern.
  [[nodiscard]] bool MatchesGgufFileName(std::string_view file_name) const;
};

// Every preset, in a stable order (family, then size). Never empty.
[[nodiscard]] const std::vector<ModelPreset>& ListPresets();

// The preset called `name`, or nullptr. Case- and separator-insensitive
// ("Llama-3-70B", "llama3_70b"), accepts aliases, HF repo ids and repo names
// ("meta-llama/Meta-Llama-3-70B", "Meta-Llama-3-70B-Instruct"), and ignores a
// trailing "instruct", "chat", "hf" or "base".
[[nodiscard]] const ModelPreset* FindPreset(std::string_view name);

// Comma-separated canonical names, for error messages.
[[nodiscard]] std::string PresetNames();

// Lowercase with '-', '_', '.', ' ' removed: "Llama-3.1-8B" -> "llama318b".
[[nodiscard]] std::string NormalizeModelName(std::string_view name);

// Parameter count from shapes: embeddings, lm_head unless tied, per layer
// q/k/v/o, the three MLP matrices, two RMSNorms and (qwen2) q/k/v biases, plus
// the final norm. Llama-3-70B: 70,553,706,496.
[[nodiscard]] int64_t EstimateParameterCount(const ModelConfig& config);

// The KV-relevant shape of a config, for kvcache::KvBytesPerToken & co.
[[nodiscard]] kvcache::KvShape KvShapeOf(const ModelConfig& config);

}  // namespace kvserve::models
