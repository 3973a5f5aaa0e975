// One entry point for model files: OpenModelFiles() takes a .gguf file or a
// Hugging Face directory (config.json + safetensors) and returns the config,
// a WeightSource with GGUF canonical tensor names, and tokenizer inputs.
// CheckWeights() verifies that a source holds every tensor the Llama forward
// needs, with the right shapes and supported types. Building the model from
// the weights is not this module's job.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/model_config.h"
#include "models/tokenizer/tokenizer_data.h"
#include "models/weights.h"

namespace kvserve::models {

struct ModelFiles {
  ModelConfig config;
  std::unique_ptr<WeightSource> weights;
  TokenizerData tokenizer;          // filled for GGUF; empty for HF
  std::string tokenizer_json_path;  // HF: <dir>/tokenizer.json if present
  std::string path;                 // what was opened
  std::string format;               // "gguf" | "safetensors"
};

struct OpenModelFilesOptions {
  // Run CheckWeights() before returning (off for tools that only inspect).
  bool check_weights = true;
};

// `path` is a GGUF file, an HF directory (config.json plus model.safetensors
// or an index with shards), or a .safetensors file with config.json beside
// it. Errors name the path (and key or tensor); NotFound if nothing is
// there.
[[nodiscard]] absl::StatusOr<ModelFiles> OpenModelFiles(
    const std::string& path, const OpenModelFilesOptions& options = {});

// Verifies every tensor the Llama forward reads (ggml shapes, ne[0] first):
//   token_embd.weight [hidden, vocab]        output_norm.weight [hidden]
//   output.weight [hidden, vocab] (unless tied_embeddings)
//   per layer N: blk.N.attn_norm.weight [hidden], ffn_norm.weight [hidden],
//   attn_q.weight [hidden, H*D], attn_k/attn_v.weight [hidden, Hkv*D],
//   attn_output.weight [H*D, hidden], ffn_gate/ffn_up.weight [hidden, inter],
//   ffn_down.weight [inter, hidden], and with qkv_bias attn_q.bias [H*D],
//   attn_k/attn_v.bias [Hkv*D].
// NotFound "<origin>: missing tensor <name>"; InvalidArgument
// "<name> in <origin>: shape [a, b], expected [c, d]" or
// "<name> in <origin>: unsupported type <T>".
[[nodiscard]] absl::Status CheckWeights(const ModelConfig& config,
                                        const WeightSource& weights);

}  // namespace kvserve::models
