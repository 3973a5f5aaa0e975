// The engine specs of one OpenAI API call: the request's prompts (one, or
// a batch) validated and tokenized by request_validation.h, the tenant's
// policy applied (ApplyTenant), and a non-streamed call's buffered size
// bounded; every error named with the client's field names. The one path
// from a parsed body to specs, shared by the HTTP handler (openai_api.h)
// and the fuzz target of the body (tests/fuzz/openai_request_fuzz.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/request_spec.h"
#include "server/openai_json.h"
#include "server/request_validation.h"
#include "server/tenants.h"

namespace kvserve::server {

// Bytes a non-streamed response holds per generated token: its text (JSON
// escaped) and, with logprobs, each alternative's token, bytes and value.
inline constexpr int64_t kResponseTextBytesPerToken = 24;
inline constexpr int64_t kResponseLogprobBytes = 48;

// One spec per prompt, in prompt order. `seed`: the seed of a call that
// sets none (a batch's prompt i samples with seed + the completions before
// it, as the completions of one n-choice request do). Thread-safe.
[[nodiscard]] absl::StatusOr<std::vector<engine::RequestSpec>> OpenAiSpecs(
    const OpenAiRequest& request, const ServedModel& model,
    const Tenant& tenant, const RequestLimits& limits, uint64_t seed);

// A field error with proto paths (ToRequestSpec's, or ApplyTenant's and
// Engine::Submit's through ToProtoFieldNames) named as the client sent it:
// OpenAI's names for `request`'s endpoint ("sampling.top_p" -> "top_p",
// "chat.messages[0].role" -> "messages[0].role", "sampling.logprobs" ->
// completions' "logprobs" or chat's "top_logprobs", a prompt of any input
// kind -> chat's "messages"), "max_tokens" as the client spelled it
// (max_completion_tokens), and a batch's prompt `batch_index` as
// "prompt[i]". Other statuses pass unchanged.
[[nodiscard]] absl::Status ClientFieldNames(
    const absl::Status& status, const OpenAiRequest& request,
    std::optional<size_t> batch_index = std::nullopt);

}  // namespace kvserve::server
