#include "engine/loaded_model.h"

#include "common/status_macros.h"
#include "engine/model_backend.h"
#include "models/loader/model_files.h"
#include "models/loader/model_resolver.h"
#include "models/rope.h"
#include "models/tokenizer/tokenizer_json.h"

namespace kvserve::engine {

absl::StatusOr<LoadedModel> LoadModel(std::string_view name_or_path,
                                      Device device, float rope_scale) {
  // Before reading any weights: a device that cannot run here fails fast.
  KV_RETURN_IF_ERROR(CheckDevice(device));
  LoadedModel out;
  KV_ASSIGN_OR_RETURN(out.path, models::ResolveModelPath(name_or_path));
  KV_ASSIGN_OR_RETURN(models::ModelFiles files,
                      models::OpenModelFiles(out.path));
  out.format = files.format;
  out.config = files.config;
  KV_RETURN_IF_ERROR(models::ApplyLinearRopeScale(rope_scale, &out.config));
  models::TokenizerData tok_data = std::move(files.tokenizer);
  if (!files.tokenizer_json_path.empty()) {
    KV_ASSIGN_OR_RETURN(tok_data,
                        models::ReadTokenizerJson(files.tokenizer_json_path));
  }
  out.chat_template = tok_data.chat_template;
  out.chat_format = models::DetectChatFormat(tok_data.chat_template, tok_data);
  KV_ASSIGN_OR_RETURN(out.tokenizer,
                      models::Tokenizer::Create(std::move(tok_data)));
  if (ResolveDevice(device) == Device::kCuda) {
    KV_RETURN_IF_ERROR(models::CheckWeights(out.config, *files.weights));
    out.weights = std::move(files.weights);
    return out;
  }
  KV_ASSIGN_OR_RETURN(out.model, models::CpuLlamaModel::Create(
                                     out.config, std::move(files.weights)));
  return out;
}

}  // namespace kvserve::engine
