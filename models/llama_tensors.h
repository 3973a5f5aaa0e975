// The Llama-family tensor names: GGUF's, which safetensors names are mapped
// to when a file is read (models/loader/safetensors.cc). The one table the
// loader's shape checks, the CPU packing and the CUDA upload read.
#pragma once

#include <string>

namespace kvserve::models {

inline constexpr char kTokenEmbdTensor[] = "token_embd.weight";
inline constexpr char kOutputNormTensor[] = "output_norm.weight";
inline constexpr char kOutputTensor[] = "output.weight";

// The tensors of one decoder layer.
enum class LayerTensor {
  kAttnNorm,
  kAttnQ,
  kAttnK,
  kAttnV,
  kAttnOutput,
  kAttnQBias,
  kAttnKBias,
  kAttnVBias,
  kFfnNorm,
  kFfnGate,
  kFfnUp,
  kFfnDown,
};

// "blk.<layer>.attn_q.weight", ...
[[nodiscard]] std::string LayerTensorName(int layer, LayerTensor tensor);

}  // namespace kvserve::models
