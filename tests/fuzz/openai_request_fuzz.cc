// Fuzzes the OpenAI request path as the HTTP handler runs it: byte 0 picks
// the endpoint (completions or chat), the rest is the body. It is parsed
// (ParseOpenAiRequest), every prompt validated and tokenized or every chat
// message rendered with the default model's chat template, a tenant's
// policy applied (OpenAiSpecs), then each spec checked as Engine::Submit
// checks it. Either an error (a 4xx code with a message naming a field)
// or specs within every limit: the tenant's priority range, the call's
// completions and tokens, the context and the vocabulary.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/request_spec.h"
#include "google/protobuf/stubs/logging.h"
#include "scheduler/scheduler_config.h"
#include "server/openai_json.h"
#include "server/openai_specs.h"
#include "tests/fuzz/request_fuzz_util.h"

namespace kvserve::server {
namespace {

constexpr int32_t kContext = 256;
constexpr int32_t kMaxSeqs = 32;
constexpr int64_t kTenantTokens = 4000;

const ServedModel& Model() {
  static const ServedModel* model =
      new ServedModel(fuzz::FuzzModel(kContext, 200));
  return *model;
}

const Tenant& FuzzTenant() {
  static const Tenant* t = [] {
    auto* t = new Tenant;
    t->name = "fuzz";
    t->cache_scope = "tenant:fuzz";
    t->limits.priority_min = -3;
    t->limits.priority_max = 3;
    t->limits.max_request_tokens = kTenantTokens;
    return t;
  }();
  return *t;
}

void Fuzz(OpenAiEndpoint endpoint, const uint8_t* data, size_t size) {
  absl::StatusOr<OpenAiRequest> request = ParseOpenAiRequest(
      absl::string_view(reinterpret_cast<const char*>(data), size), endpoint);
  if (!request.ok()) return fuzz::CheckRejection(request.status());
  RequestLimits limits;
  limits.max_completions = kMaxSeqs;
  limits.max_request_tokens = int64_t{kMaxSeqs} * kContext;
  limits.max_response_bytes = 1 << 20;
  auto specs = OpenAiSpecs(*request, Model(), FuzzTenant(), limits, 7);
  if (!specs.ok()) return fuzz::CheckRejection(specs.status());
  if (specs->empty()) __builtin_trap();
  scheduler::SchedulerConfig config;
  config.max_model_len = kContext;
  config.num_blocks = 1024;
  int64_t completions = 0;
  int64_t work = 0;
  for (const engine::RequestSpec& spec : *specs) {
    if (spec.priority < -3 || spec.priority > 3) __builtin_trap();
    if (spec.tenant.name != "fuzz") __builtin_trap();
    completions += spec.n;
    work += static_cast<int64_t>(spec.prompt_tokens.size()) +
            int64_t{spec.n} * spec.max_tokens;
    absl::Status engine =
        engine::CheckRequestSpec(spec, Model().tokenizer->vocab_size());
    if (engine.ok()) {
      engine = config.CheckRequestSize(
          static_cast<int64_t>(spec.prompt_tokens.size()), spec.max_tokens);
    }
    if (!engine.ok()) {
      fuzz::CheckRejection(engine);
      continue;
    }
    if (spec.prompt_tokens.empty() ||
        static_cast<int64_t>(spec.prompt_tokens.size()) + spec.max_tokens >
            kContext) {
      __builtin_trap();
    }
  }
  if (completions > kMaxSeqs || work > kTenantTokens) __builtin_trap();
}

}  // namespace
}  // namespace kvserve::server

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kvserve::server::Fuzz(data[0] % 2 == 0
                            ? kvserve::server::OpenAiEndpoint::kCompletions
                            : kvserve::server::OpenAiEndpoint::kChatCompletions,
                        data + 1, size - 1);
  return 0;
}
