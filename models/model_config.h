// Architecture numbers of a Llama-family model, from GGUF metadata, HF
// config.json, or a named preset. Plain data; Validate() checks consistency.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace kvserve::models {

enum class RopeScalingType { kNone, kLinear, kLlama3 };
// "none", "linear", "llama3" (config.json's rope_type names).
[[nodiscard]] inline const char* RopeScalingTypeName(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kNone:
      break;
  }
  return "none";
}

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position = 8192;
};

// How RoPE pairs dimensions. GGUF files of arch "llama" store Q/K rows
// permuted so that adjacent pairs (2i, 2i+1) rotate together (ggml NORM);
// HF checkpoints and GGUF "qwen2" pair i with i + D/2 (NEOX, rotate_half).
enum class RopeStyle { kInterleaved, kHalfSplit };

enum class ChatFormat { kNone, kChatML, kLlama3, kLlama2 };

struct ModelConfig {
  std::string name;          // preset or general.name
  std::string architecture;  // "llama", "qwen2", "mistral"
  int num_layers = 0;
  int hidden_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position = 0;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::kHalfSplit;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  int sliding_window = 0;  // 0 = full attention
  // Bytes per element of the checkpoint's native dtype (2 for bf16/fp16).
  int weight_dtype_bytes = 2;
  // Multi-head latent attention (DeepSeek-V2/V3; architecture "deepseek_v2"
  // or "deepseek_v3"), all 0 for GQA/MHA. Such configs are read for sizing
  // only (kvserve plan); no forward pass implements them.
  int kv_lora_rank = 0;      // compressed KV latent cached per layer
  int qk_rope_head_dim = 0;  // decoupled RoPE key, shared by all heads
  int qk_nope_head_dim = 0;  // per-head key part without RoPE
  int v_head_dim = 0;        // per-head value

  int GroupSize() const { return num_heads / num_kv_heads; }
  bool IsMla() const { return kv_lora_rank > 0; }
  [[nodiscard]] absl::Status Validate() const;
};

}  // namespace kvserve::models
