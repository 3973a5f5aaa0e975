// Fuzzes the gRPC request conversion as a Generate call runs it: the bytes
// of a call (a grpc::ByteBuffer, as the raw method receives it) parsed with
// the field-naming UTF-8 check (wire_codec.h), validated and tokenized
// (request_validation.h), the tenant's policy applied, then checked as
// Engine::Submit checks it. Either an error (INVALID_ARGUMENT or
// OUT_OF_RANGE with a message) or a spec within the limits and the
// tenant's priority range.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/request_spec.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "scheduler/scheduler_config.h"
#include "server/request_validation.h"
#include "server/wire_codec.h"
#include "tests/fuzz/request_fuzz_util.h"

namespace kvserve::server {
namespace {

constexpr int32_t kContext = 256;

const ServedModel& Model() {
  static const ServedModel* model =
      new ServedModel(fuzz::FuzzModel(kContext, 0));
  return *model;
}

void Fuzz(const uint8_t* data, size_t size) {
  grpc::Slice slice(data, size);
  const grpc::ByteBuffer buffer(&slice, 1);
  v1::GenerateRequest request;
  if (absl::Status s = ParseRequest(buffer, &request); !s.ok()) {
    return fuzz::CheckRejection(s);
  }
  std::vector<engine::RequestSpec> specs(1);
  auto spec = ToRequestSpec(request, Model(), 7);
  if (!spec.ok()) return fuzz::CheckRejection(spec.status());
  specs[0] = *std::move(spec);
  Tenant tenant;
  tenant.name = "fuzz";
  tenant.limits.priority_min = -5;
  tenant.limits.priority_max = 0;
  RequestLimits limits;
  limits.max_completions = 8;
  limits.max_request_tokens = 8 * kContext;
  if (absl::Status s = ApplyTenant(tenant, limits, &specs); !s.ok()) {
    return fuzz::CheckRejection(s);
  }
  const engine::RequestSpec& out = specs[0];
  if (out.priority < -5 || out.priority > 0 || out.n > 8) __builtin_trap();
  absl::Status engine =
      engine::CheckRequestSpec(out, Model().tokenizer->vocab_size());
  if (engine.ok()) {
    scheduler::SchedulerConfig config;
    config.max_model_len = kContext;
    config.num_blocks = 1024;
    engine = config.CheckRequestSize(
        static_cast<int64_t>(out.prompt_tokens.size()), out.max_tokens);
  }
  if (!engine.ok()) return fuzz::CheckRejection(engine);
  if (out.prompt_tokens.empty() ||
      static_cast<int64_t>(out.prompt_tokens.size()) + out.max_tokens >
          kContext) {
    __builtin_trap();
  }
}

}  // namespace
}  // namespace kvserve::server

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvserve::server::Fuzz(data, size);
  return 0;
}
