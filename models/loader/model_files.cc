#include "models/loader/model_files.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "models/llama_tensors.h"
#include "models/loader/gguf.h"
#include "models/loader/gguf_config.h"
#include "models/loader/hf_config.h"
#include "models/loader/safetensors.h"

namespace kvserve::models {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<ModelFiles> OpenGguf(const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  ModelFiles m;
  KV_ASSIGN_OR_RETURN(m.config, ModelConfigFromGguf(*file));
  KV_ASSIGN_OR_RETURN(m.tokenizer, TokenizerDataFromGguf(*file));
  m.weights = std::make_unique<GgufWeightSource>(std::move(file));
  m.path = path;
  m.format = "gguf";
  return m;
}

// `dir` holds config.json (and tokenizer.json); `weights` is the directory
// itself or a single .safetensors file in it.
absl::StatusOr<ModelFiles> OpenHf(const std::string& path, const fs::path& dir,
                                  const std::string& weights) {
  std::error_code ec;
  const fs::path config = dir / "config.json";
  if (!fs::exists(config, ec)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": no config.json in ", dir.string()));
  }
  ModelFiles m;
  KV_ASSIGN_OR_RETURN(m.config, LoadHfConfig(config.string()));
  KV_ASSIGN_OR_RETURN(m.weights, SafetensorsWeightSource::Open(weights));
  const fs::path tokenizer = dir / "tokenizer.json";
  if (fs::exists(tokenizer, ec)) m.tokenizer_json_path = tokenizer.string();
  m.path = path;
  m.format = "safetensors";
  return m;
}

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

std::vector<Expected> ExpectedTensors(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size;
  const int64_t q = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  const int64_t inter = c.intermediate_size;
  std::vector<Expected> out = {{kTokenEmbdTensor, {hidden, c.vocab_size}}};
  for (int i = 0; i < c.num_layers; ++i) {
    auto add = [&](LayerTensor t, std::vector<int64_t> shape) {
      out.push_back({LayerTensorName(i, t), std::move(shape)});
    };
    add(LayerTensor::kAttnNorm, {hidden});
    add(LayerTensor::kAttnQ, {hidden, q});
    add(LayerTensor::kAttnK, {hidden, kv});
    add(LayerTensor::kAttnV, {hidden, kv});
    add(LayerTensor::kAttnOutput, {q, hidden});
    if (c.qkv_bias) {
      add(LayerTensor::kAttnQBias, {q});
      add(LayerTensor::kAttnKBias, {kv});
      add(LayerTensor::kAttnVBias, {kv});
    }
    add(LayerTensor::kFfnNorm, {hidden});
    add(LayerTensor::kFfnGate, {hidden, inter});
    add(LayerTensor::kFfnUp, {hidden, inter});
    add(LayerTensor::kFfnDown, {inter, hidden});
  }
  out.push_back({kOutputNormTensor, {hidden}});
  if (!c.tied_embeddings) {
    out.push_back({kOutputTensor, {hidden, c.vocab_size}});
  }
  return out;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<ModelFiles> OpenModelFiles(
    const std::string& path, const OpenModelFilesOptions& options) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": no such file or directory"));
  }
  absl::StatusOr<ModelFiles> m;
  if (fs::is_directory(path, ec)) {
    m = OpenHf(path, fs::path(path), path);
  } else if (absl::EndsWith(path, ".safetensors")) {
    m = OpenHf(path, fs::path(path).parent_path(), path);
  } else {
    m = OpenGguf(path);
  }
  if (m.ok() && options.check_weights) {
    KV_RETURN_IF_ERROR(CheckWeights(m->config, *m->weights));
  }
  return m;
}

absl::Status CheckWeights(const ModelConfig& config,
                          const WeightSource& weights) {
  const std::string& origin = weights.origin();
  for (const Expected& e : ExpectedTensors(config)) {
    if (!weights.Has(e.name)) {
      return absl::NotFoundError(
          absl::StrCat(origin, ": missing tensor ", e.name));
    }
    KV_ASSIGN_OR_RETURN(const RawTensor t, weights.Get(e.name));
    if (t.shape != e.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(e.name, " in ", origin, ": shape ", ShapeString(t.shape),
                       ", expected ", ShapeString(e.shape)));
    }
    if (!TypeTraits(t.type).supported) {
      return absl::InvalidArgumentError(
          absl::StrCat(e.name, " in ", origin, ": unsupported type ",
                       std::string(TypeName(t.type)), " (id ",
                       static_cast<uint32_t>(t.type), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvserve::models
