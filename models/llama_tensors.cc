#include "models/llama_tensors.h"

#include "absl/strings/str_cat.h"

namespace kvserve::models {
namespace {

const char* Suffix(LayerTensor t) {
  switch (t) {
    case LayerTensor::kAttnNorm:
      return "attn_norm.weight";
    case LayerTensor::kAttnQ:
      return "attn_q.weight";
    case LayerTensor::kAttnK:
      return "attn_k.weight";
    case LayerTensor::kAttnV:
      return "attn_v.weight";
    case LayerTensor::kAttnOutput:
      return "attn_output.weight";
    case LayerTensor::kAttnQBias:
      return "attn_q.bias";
    case LayerTensor::kAttnKBias:
      return "attn_k.bias";
    case LayerTensor::kAttnVBias:
      return "attn_v.bias";
    case LayerTensor::kFfnNorm:
      return "ffn_norm.weight";
    case LayerTensor::kFfnGate:
      return "ffn_gate.weight";
    case LayerTensor::kFfnUp:
      return "ffn_up.weight";
    case LayerTensor::kFfnDown:
      return "ffn_down.weight";
  }
  return "unknown";
}

}  // namespace

std::string LayerTensorName(int layer, LayerTensor tensor) {
  return absl::StrCat("blk.", layer, ".", Suffix(tensor));
}

}  // namespace kvserve::models
