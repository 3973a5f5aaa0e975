// Fuzzes request validation with random protobuf messages: the first input
// byte picks GenerateRequest / TokenizeRequest / DetokenizeRequest, the rest
// is parsed as that message's wire format (bytes that do not parse are
// skipped; libFuzzer's comparison tracing finds the field tags quickly). A
// request, through the server's validation and then the engine's own check
// of the spec (what Engine::Submit runs), either fails with
// INVALID_ARGUMENT or OUT_OF_RANGE and a message, or yields a spec within
// the model's limits.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/request_spec.h"
#include "google/protobuf/stubs/logging.h"
#include "scheduler/scheduler_config.h"
#include "server/request_validation.h"
#include "tests/fuzz/request_fuzz_util.h"

namespace kvserve::server {
namespace {

constexpr int32_t kContext = 256;

const ServedModel& Model() {
  static const ServedModel* model =
      new ServedModel(fuzz::FuzzModel(kContext, 0));
  return *model;
}

void FuzzGenerate(const uint8_t* data, size_t size) {
  v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  auto spec = ToRequestSpec(request, Model(), /*seed_if_unset=*/7);
  if (!spec.ok()) return fuzz::CheckRejection(spec.status());
  const int32_t vocab = Model().tokenizer->vocab_size();
  // The engine's checks: the spec's own limits, then its size against the
  // context and a pool that holds it.
  absl::Status engine = engine::CheckRequestSpec(*spec, vocab);
  if (engine.ok()) {
    scheduler::SchedulerConfig config;
    config.max_model_len = kContext;
    config.num_blocks = 1024;
    engine = config.CheckRequestSize(
        static_cast<int64_t>(spec->prompt_tokens.size()), spec->max_tokens);
  }
  if (!engine.ok()) return fuzz::CheckRejection(engine);
  if (spec->prompt_tokens.empty() || spec->max_tokens < 1) __builtin_trap();
  if (static_cast<int64_t>(spec->prompt_tokens.size()) > kContext) {
    __builtin_trap();
  }
  if (static_cast<int64_t>(spec->prompt_tokens.size()) + spec->max_tokens >
      kContext) {
    __builtin_trap();
  }
  for (int32_t id : spec->prompt_tokens) {
    if (id < 0 || id >= vocab) __builtin_trap();
  }
  for (int32_t id : spec->stop_token_ids) {
    if (id < 0 || id >= vocab) __builtin_trap();
  }
}

void FuzzTokenize(const uint8_t* data, size_t size) {
  v1::TokenizeRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  auto ids = TokenizeText(request, Model(), {});
  if (!ids.ok()) fuzz::CheckRejection(ids.status());
}

void FuzzDetokenize(const uint8_t* data, size_t size) {
  v1::DetokenizeRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  auto text = DetokenizeIds(request, Model());
  if (!text.ok()) fuzz::CheckRejection(text.status());
}

}  // namespace
}  // namespace kvserve::server

// Protobuf logs every string field with invalid UTF-8 it rejects; quiet.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0:
      kvserve::server::FuzzGenerate(data + 1, size - 1);
      break;
    case 1:
      kvserve::server::FuzzTokenize(data + 1, size - 1);
      break;
    default:
      kvserve::server::FuzzDetokenize(data + 1, size - 1);
      break;
  }
  return 0;
}
