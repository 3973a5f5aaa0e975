// Engine -> proto conversion of what the server sends back: stream deltas
// as GenerateResponse messages and the engine's ModelInfo. Owns the mapping
// of FinishReason to the proto enum; does not decide the call's ending
// status (status_mapping.h does).
#pragma once

#include "engine/engine.h"
#include "engine/request_spec.h"
#include "kvserve/v1/kvserve.pb.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::server {

[[nodiscard]] v1::FinishReason ToProto(engine::FinishReason reason);

// One streamed message. Finish fields (reason, usage, timings) are set only
// when `delta.finished`. `tokenizer` supplies logprob token pieces.
void ToProto(const engine::StreamDelta& delta,
             const models::Tokenizer& tokenizer, v1::GenerateResponse* out);

void ToProto(const engine::ModelInfo& info, v1::ModelInfo* out);

}  // namespace kvserve::server
