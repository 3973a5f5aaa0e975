// Turns a model name or path into everything needed to run it: resolved
// path, config, tokenizer, chat format, and the packed CPU model. The single
// place that wires resolver, file readers, tokenizer, and forward together.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/runner/device.h"
#include "models/model_config.h"
#include "models/tokenizer/chat_template.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::models {
class CpuLlamaModel;
class WeightSource;
}  // namespace kvserve::models

namespace kvserve::engine {

// NOTE: the weights' types are declared, not included: engine.h (and with
// it every server/ file) must not pull in the CPU kernels.
struct LoadedModel {
  LoadedModel();
  ~LoadedModel();
  LoadedModel(LoadedModel&&) noexcept;
  LoadedModel& operator=(LoadedModel&&) noexcept;

  std::string path;    // resolved file or directory
  std::string format;  // "gguf" | "safetensors"
  models::ModelConfig config;
  std::unique_ptr<models::Tokenizer> tokenizer;
  models::ChatFormat chat_format = models::ChatFormat::kNone;
  std::string chat_template;  // the model's own template text, if any
  std::unique_ptr<models::CpuLlamaModel> model;  // CPU: the packed model
  // GPU loads: the raw weights, kept for the backend's upload instead of
  // packing a CPU model (model stays null); the backend releases them.
  std::unique_ptr<models::WeightSource> weights;
};

// Resolves `name_or_path` (preset name, .gguf file, or HF directory), loads
// and packs the weights. Errors name the file and what is wrong; a preset
// whose weights are absent names every place that was searched. `device`
// (as --device): when it resolves to Device::kCuda the weights
// are checked and kept in `weights` for the GPU upload, not packed. A
// device that cannot run here gets CheckDevice's error before any file is
// read. `rope_scale` > 1 (--rope-scale) stretches RoPE linearly and the
// context with it (models::ApplyLinearRopeScale) before anything is built
// from the config. Device::kSim reads no weights: the config and tokenizer
// of the files the name resolves to, else (a preset without files) the
// preset's architecture, path "preset:<name>", format "preset" and the
// synthetic tokenizer (models/tokenizer/synthetic_tokenizer.h).
// The weights as held for the device, for the start log: the file's bytes
// by ggml type and the packed bytes of a CPU load ("" when none are held).
[[nodiscard]] std::string DescribeWeights(const LoadedModel& model);

[[nodiscard]] absl::StatusOr<LoadedModel> LoadModel(
    std::string_view name_or_path, Device device = Device::kCpu,
    float rope_scale = 1.0f);

}  // namespace kvserve::engine
