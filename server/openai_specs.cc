#include "server/openai_specs.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/field_error.h"
#include "common/status_macros.h"

namespace kvserve::server {
namespace {

absl::Status CheckResponseBytes(const OpenAiRequest& request,
                                const std::vector<engine::RequestSpec>& specs,
                                int64_t limit) {
  if (request.stream || limit <= 0) return absl::OkStatus();
  const int64_t per_token =
      kResponseTextBytesPerToken +
      (request.logprobs ? kResponseLogprobBytes * (1 + request.top_logprobs)
                        : 0);
  int64_t bytes = 0;
  for (const engine::RequestSpec& s : specs) {
    bytes += int64_t{s.n} * s.max_tokens * per_token;
  }
  if (bytes <= limit) return absl::OkStatus();
  return InvalidFieldError(
      "stream",
      absl::StrFormat(
          "a non-streamed response of up to %d bytes (n x max_tokens x %d "
          "bytes per token%s), over the limit of %d bytes "
          "(--max-response-bytes); send \"stream\": true or ask for fewer "
          "tokens",
          bytes, per_token, request.logprobs ? " with logprobs" : "", limit));
}

absl::StatusOr<std::vector<engine::RequestSpec>> PromptSpecs(
    const OpenAiRequest& request, const ServedModel& model,
    const RequestLimits& limits, uint64_t seed) {
  std::vector<engine::RequestSpec> specs;
  if (request.batch.empty()) {
    absl::StatusOr<engine::RequestSpec> spec =
        ToRequestSpec(request.generate, model, seed, limits);
    if (!spec.ok()) return ClientFieldNames(spec.status(), request);
    specs.push_back(*std::move(spec));
    return specs;
  }
  uint64_t choices_before = 0;
  for (size_t i = 0; i < request.batch.size(); ++i) {
    v1::GenerateRequest one = request.generate;
    const v1::GenerateRequest& input = request.batch[i];
    if (input.has_prompt_token_ids()) {
      *one.mutable_prompt_token_ids() = input.prompt_token_ids();
    } else {
      one.set_prompt(input.prompt());
    }
    absl::StatusOr<engine::RequestSpec> spec =
        ToRequestSpec(one, model, seed + choices_before, limits);
    if (!spec.ok()) {
      return ClientFieldNames(spec.status(), request, i);
    }
    choices_before += static_cast<uint64_t>(spec->n);
    specs.push_back(*std::move(spec));
  }
  return specs;
}

}  // namespace

absl::Status ClientFieldNames(const absl::Status& status,
                              const OpenAiRequest& request,
                              std::optional<size_t> batch_index) {
  std::optional<std::string> field = ErrorField(status);
  if (!field.has_value()) return status;
  const bool chat = request.endpoint == OpenAiEndpoint::kChatCompletions;
  const FieldRename proto_to_openai[] = {
      {"sampling.logprobs", chat ? "top_logprobs" : "logprobs"},
      {"sampling.", ""},
      {"chat.messages", "messages"},
      {"chat", "messages"},
      {"prompt", chat ? "messages" : "prompt"},
      {"prompt_token_ids.ids", "prompt"},
      {"prompt_token_ids", "prompt"},
  };
  if (absl::StartsWith(*field, "structured_output") &&
      !request.structured_output_field.empty()) {
    return RenameField(status, request.structured_output_field);
  }
  std::string name = RenamePath(*field, proto_to_openai);
  name = RenamePath(name, {{"max_tokens", request.max_tokens_name}});
  if (batch_index.has_value()) {
    const std::string prompt = absl::StrCat("prompt[", *batch_index, "]");
    name = RenamePath(name, {{"prompt", prompt}});
  }
  return RenameField(status, name);
}

absl::StatusOr<std::vector<engine::RequestSpec>> OpenAiSpecs(
    const OpenAiRequest& request, const ServedModel& model,
    const Tenant& tenant, const RequestLimits& limits, uint64_t seed) {
  KV_ASSIGN_OR_RETURN(std::vector<engine::RequestSpec> specs,
                      PromptSpecs(request, model, limits, seed));
  if (absl::Status s = ApplyTenant(tenant, limits, &specs); !s.ok()) {
    return ClientFieldNames(ToProtoFieldNames(s), request);
  }
  KV_RETURN_IF_ERROR(
      CheckResponseBytes(request, specs, limits.max_response_bytes));
  return specs;
}

}  // namespace kvserve::server
