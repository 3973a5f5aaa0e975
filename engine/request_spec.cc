#include "engine/request_spec.h"

#include <string_view>

#include "absl/strings/str_format.h"
#include "common/field_error.h"
#include "common/status_macros.h"

namespace kvserve::engine {
namespace {

absl::Status CheckVocab(const std::vector<int32_t>& ids, int32_t vocab_size,
                        std::string_view field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return InvalidFieldError(
          absl::StrFormat("%s[%d]", field, i),
          absl::StrFormat("unknown token id %d (the vocabulary is [0, %d))",
                          ids[i], vocab_size));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestSpec(const RequestSpec& spec, int32_t vocab_size) {
  if (spec.n < 1 || spec.n > kMaxCompletions) {
    return InvalidFieldError("n", absl::StrFormat("must be in [1, %d], got %d",
                                                  kMaxCompletions, spec.n));
  }
  // A bad max_tokens is CheckRequestSize's to name.
  if (spec.max_tokens >= 1 && (spec.sampling.min_tokens < 0 ||
                               spec.sampling.min_tokens > spec.max_tokens)) {
    return InvalidFieldError(
        "min_tokens",
        absl::StrFormat("must be in [0, max_tokens = %d], got %d",
                        spec.max_tokens, spec.sampling.min_tokens));
  }
  if (spec.grammar != nullptr) {
    // A complete match allows only the stop tokens: generating past them,
    // or masking them, would leave no token to sample.
    if (spec.ignore_eos) {
      return InvalidFieldError("ignore_eos",
                               "cannot be combined with structured output (the "
                               "grammar's end is the output's end)");
    }
    if (spec.sampling.min_tokens > 0) {
      return InvalidFieldError("min_tokens",
                               "cannot be combined with structured output (the "
                               "grammar decides where the output ends)");
    }
  }
  KV_RETURN_IF_ERROR(
      CheckVocab(spec.prompt_tokens, vocab_size, "prompt_token_ids"));
  return CheckVocab(spec.stop_token_ids, vocab_size, "stop_token_ids");
}

void AddKvUsage(const KvUsage& part, KvUsage* sum) {
  if (!sum->kv_dtype.has_value()) sum->kv_dtype = part.kv_dtype;
  sum->peak_blocks += part.peak_blocks;
  sum->peak_bytes += part.peak_bytes;
  sum->preemptions_recompute += part.preemptions_recompute;
  sum->preemptions_swap += part.preemptions_swap;
  sum->recomputed_tokens += part.recomputed_tokens;
  sum->dropped_tokens += part.dropped_tokens;
  sum->swapped_out_bytes += part.swapped_out_bytes;
  sum->swapped_in_bytes += part.swapped_in_bytes;
  sum->queued_seconds += part.queued_seconds;
  sum->preempted_seconds += part.preempted_seconds;
  sum->cached_tokens_device += part.cached_tokens_device;
  sum->cached_tokens_disk += part.cached_tokens_disk;
  sum->cached_tokens_remote += part.cached_tokens_remote;
  sum->cached_tokens_host += part.cached_tokens_host;
  sum->draft_tokens += part.draft_tokens;
  sum->accepted_draft_tokens += part.accepted_draft_tokens;
}

}  // namespace kvserve::engine
