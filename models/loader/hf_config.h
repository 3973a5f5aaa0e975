// ModelConfig from a Hugging Face config.json (model_type llama, mistral,
// qwen2; DeepSeek-V2/V3 multi-head latent attention for sizing only). Owns the
// HF key names, their defaults and rope_scaling parsing; weights are
// safetensors.h's job and tokenizer.json the tokenizer's.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "models/model_config.h"

namespace kvserve::models {

// Parses config.json text. `origin` (the file path) prefixes every error
// message. Reads num_hidden_layers, hidden_size, num_attention_heads,
// num_key_value_heads (default: heads), head_dim (default hidden / heads),
// intermediate_size, vocab_size, max_position_embeddings, rope_theta
// (default 10000), rms_norm_eps (default 1e-6), rope_scaling (null,
// "default", "linear", "llama3"), tie_word_embeddings (default false),
// sliding_window (0 when null or use_sliding_window is false; qwen2 defaults
// use_sliding_window to false), torch_dtype or dtype (bfloat16/float16 -> 2
// bytes, float32 -> 4; default 2), attention_bias. qkv_bias is true for qwen2
// or attention_bias; rope_style is always kHalfSplit. name is _name_or_path
// (may be empty). The result passes Validate(). An MLA config (see
// IsMlaHfConfig) is InvalidArgument naming MLA: no forward pass serves it.
[[nodiscard]] absl::StatusOr<ModelConfig> ParseHfConfig(
    std::string_view json_text, const std::string& origin);

// True if config.json text describes multi-head latent attention: a
// kv_lora_rank > 0, architectures naming DeepseekV2ForCausalLM or
// DeepseekV3ForCausalLM, or model_type deepseek_v2 / deepseek_v3. False for
// text that is not a JSON object.
[[nodiscard]] bool IsMlaHfConfig(std::string_view json_text);

// For sizing only (kvserve plan): an MLA config.json needs no weights and is
// read here; anything else is ParseHfConfig. Reads num_hidden_layers,
// hidden_size, num_attention_heads, num_key_value_heads (default: heads),
// intermediate_size, vocab_size, max_position_embeddings, kv_lora_rank (>= 1),
// qk_rope_head_dim, qk_nope_head_dim, v_head_dim, torch_dtype/dtype,
// tie_word_embeddings and _name_or_path; head_dim becomes qk_nope_head_dim +
// qk_rope_head_dim (the query/key head). MoE and rope_scaling (yarn) keys are
// not read. The result passes Validate().
[[nodiscard]] absl::StatusOr<ModelConfig> ParseHfSizingConfig(
    std::string_view json_text, const std::string& origin);

// Reads and parses `config_path`; an empty name becomes the name of the
// directory holding the file.
[[nodiscard]] absl::StatusOr<ModelConfig> LoadHfConfig(
    const std::string& config_path);

}  // namespace kvserve::models
