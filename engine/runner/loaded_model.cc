#include "engine/runner/loaded_model.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/runner/model_backend.h"
#include "engine/runner/platform.h"
#include "models/cpu/cpu_llama_model.h"
#include "models/ggml_types.h"
#include "models/loader/model_files.h"
#include "models/loader/model_resolver.h"
#include "models/loader/presets.h"
#include "models/rope.h"
#include "models/tokenizer/synthetic_tokenizer.h"
#include "models/tokenizer/tokenizer_json.h"

namespace kvserve::engine {

LoadedModel::LoadedModel() = default;
LoadedModel::~LoadedModel() = default;
LoadedModel::LoadedModel(LoadedModel&&) noexcept = default;
LoadedModel& LoadedModel::operator=(LoadedModel&&) noexcept = default;

std::string DescribeWeights(const LoadedModel& m) {
  if (m.model == nullptr) return "";
  const std::string& note = m.model->tile_prefetch_note();
  return absl::StrFormat(
      "%s, %.1f MiB packed%s%s",
      models::FileBytesByTypeText(m.model->source_bytes_by_type()),
      m.model->weight_bytes() / 1048576.0, note.empty() ? "" : "; ", note);
}

namespace {

// Config and tokenizer of opened files into `out`.
absl::Status TakeConfigAndTokenizer(models::ModelFiles& files, float rope_scale,
                                    LoadedModel* out) {
  out->format = files.format;
  out->config = files.config;
  KV_RETURN_IF_ERROR(models::ApplyLinearRopeScale(rope_scale, &out->config));
  models::TokenizerData tok_data = std::move(files.tokenizer);
  if (!files.tokenizer_json_path.empty()) {
    KV_ASSIGN_OR_RETURN(tok_data,
                        models::ReadTokenizerJson(files.tokenizer_json_path));
  }
  out->chat_template = tok_data.chat_template;
  out->chat_format = models::DetectChatFormat(tok_data.chat_template, tok_data);
  KV_ASSIGN_OR_RETURN(out->tokenizer,
                      models::Tokenizer::Create(std::move(tok_data)));
  return absl::OkStatus();
}

// The simulated device needs no weights: the files' config and tokenizer
// where the model resolves to files, else a preset's architecture with the
// synthetic tokenizer.
absl::StatusOr<LoadedModel> LoadForSim(std::string_view name_or_path,
                                       float rope_scale) {
  LoadedModel out;
  absl::StatusOr<std::string> path = models::ResolveModelPath(name_or_path);
  const models::ModelPreset* preset = models::FindPreset(name_or_path);
  if (!path.ok() && preset == nullptr) return path.status();
  if (path.ok()) {
    out.path = *path;
    KV_ASSIGN_OR_RETURN(
        models::ModelFiles files,
        models::OpenModelFiles(out.path, {.check_weights = false}));
    KV_RETURN_IF_ERROR(TakeConfigAndTokenizer(files, rope_scale, &out));
    return out;
  }
  out.path = absl::StrCat("preset:", preset->name);
  out.format = "preset";
  out.config = preset->config;
  KV_RETURN_IF_ERROR(models::ApplyLinearRopeScale(rope_scale, &out.config));
  KV_ASSIGN_OR_RETURN(models::TokenizerData tok_data,
                      models::SyntheticTokenizerData(out.config.vocab_size));
  KV_ASSIGN_OR_RETURN(out.tokenizer,
                      models::Tokenizer::Create(std::move(tok_data)));
  return out;
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(std::string_view name_or_path,
                                      Device device, float rope_scale) {
  const Platform& platform = PlatformFor(device);
  // Before reading any weights: a device that cannot run here fails fast.
  KV_RETURN_IF_ERROR(platform.Check());
  if (platform.weight_form() == WeightForm::kNone) {
    return LoadForSim(name_or_path, rope_scale);
  }
  LoadedModel out;
  KV_ASSIGN_OR_RETURN(out.path, models::ResolveModelPath(name_or_path));
  KV_ASSIGN_OR_RETURN(models::ModelFiles files,
                      models::OpenModelFiles(out.path));
  KV_RETURN_IF_ERROR(TakeConfigAndTokenizer(files, rope_scale, &out));
  if (platform.weight_form() == WeightForm::kRaw) {
    KV_RETURN_IF_ERROR(models::CheckWeights(out.config, *files.weights));
    out.weights = std::move(files.weights);
    return out;
  }
  KV_ASSIGN_OR_RETURN(out.model, models::CpuLlamaModel::Create(
                                     out.config, std::move(files.weights)));
  return out;
}

}  // namespace kvserve::engine
