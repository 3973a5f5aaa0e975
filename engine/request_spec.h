// What the server hands the engine for one generation: validated, already
// tokenized, free of proto types.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/runner/sampler.h"
#include "grammar/grammar_compiler.h"
#include "kvcache/kv_format.h"
#include "scheduler/request.h"

namespace kvserve::engine {

using RequestId = int64_t;

// Most completions one request may ask for (RequestSpec::n).
inline constexpr int32_t kMaxCompletions = 16;

// Who sent a request, as the engine and the scheduler need it: the server
// resolves it from the bearer token (server/tenants.h); without tokens
// every request is the one tenant "default".
struct RequestTenant {
  std::string name = "default";  // a metric label and the fair-share key
  // Prefix-cache scope: requests share cached KV only within one scope.
  std::string cache_scope;
  bool scope_shared = false;  // whole-block hits only
  int32_t weight = 1;         // share among tenants with work
  int32_t max_running = 0;    // sequences at once; 0: max_num_seqs only
  int32_t max_queued = 0;     // completions waiting; 0: the server's only
};

struct RequestSpec {
  std::vector<int32_t> prompt_tokens;
  SamplingParams sampling;
  int32_t max_tokens = 16;
  std::vector<std::string> stop;        // stop strings
  std::vector<int32_t> stop_token_ids;  // extra stop tokens
  // The matched stop string ends the text (vLLM's option); else it is cut.
  bool include_stop_str_in_output = false;
  // Control tokens ("<|im_end|>") add no text.
  bool skip_special_tokens = true;
  bool ignore_eos = false;
  int32_t priority = 0;  // lower = more important
  std::optional<absl::Time> deadline;
  bool detokenize = true;
  // Prefix-cache sub-scope within the tenant's scope: requests share cached
  // KV blocks only under equal salts (empty: the tenant's whole scope).
  std::string cache_salt;
  RequestTenant tenant;
  // Completions sharing the prompt (1..16). Completion i samples with seed
  // sampling.seed + i, so it equals an n = 1 request with that seed.
  int32_t n = 1;
  // A bounded KV cache (kv_policy "streaming"); disabled: the full cache.
  scheduler::KvWindow kv_window;
  // Speculative decoding where the engine has it on (--speculative);
  // false: this request never drafts.
  bool speculate = true;
  // Structured output: every completion's text matches this grammar
  // (compiled by Engine::grammar_compiler(); null: unconstrained).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// The limits of a spec that do not depend on the KV pool: n in [1,
// kMaxCompletions], min_tokens in [0, max_tokens], prompt and stop token
// ids in [0, vocab_size), no ignore_eos or min_tokens with a grammar (it
// ends the output). INVALID_ARGUMENT naming the RequestSpec field.
// Engine::Submit checks these, then SchedulerConfig::CheckRequestSize.
[[nodiscard]] absl::Status CheckRequestSpec(const RequestSpec& spec,
                                            int32_t vocab_size);

// The scheduler's enum (scheduler/request.h) is the one source: the engine
// finishes requests in the scheduler with the reason it streams.
using FinishReason = scheduler::FinishReason;
using scheduler::FinishReasonName;

// What a request cost the KV cache. A usage that covers several completions
// or prompts sums theirs (a block shared by two completions counts in both
// peaks); kv_dtype is the engine's (unset in a usage that holds none).
struct KvUsage {
  std::optional<kvcache::KvDtype> kv_dtype;
  int32_t peak_blocks = 0;  // most blocks held at once
  int64_t peak_bytes = 0;   // peak_blocks * bytes per block
  int32_t preemptions_recompute = 0;
  int32_t preemptions_swap = 0;
  int64_t recomputed_tokens = 0;  // computed tokens preemption discarded
  // Tokens whose KV its kv_policy dropped (RequestKvStats::dropped_tokens).
  int64_t dropped_tokens = 0;
  int64_t swapped_out_bytes = 0;
  int64_t swapped_in_bytes = 0;
  double queued_seconds = 0;     // arrival -> first scheduled
  double preempted_seconds = 0;  // preempted -> scheduled again, summed
  // The cached prompt tokens (Usage::cached_prompt_tokens) by where they
  // were found: in the pool, or loaded from the disk or the remote tier for
  // this request.
  // Summed over prompts like their count; over the completions of one
  // prompt, which share it, the split of the one with the most cached
  // tokens (StreamState), as their count is its.
  int32_t cached_tokens_device = 0;
  int32_t cached_tokens_host = 0;
  int32_t cached_tokens_disk = 0;
  int32_t cached_tokens_remote = 0;
  // Speculative decoding: draft tokens verified for it, and accepted.
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;
  KvUsage kv;
};

// Adds `part`'s KV costs to `sum` (see KvUsage).
void AddKvUsage(const KvUsage& part, KvUsage* sum);

struct Timings {
  absl::Time arrival;              // when Submit took the request
  double queue_seconds = 0;        // arrival -> first scheduled
  double time_to_first_token = 0;  // arrival -> first token
  double total_seconds = 0;        // arrival -> finish
};

struct TokenLogprobs {
  int32_t token = -1;
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

// A coalesced chunk of one completion (`index`) of a request's output
// stream. With n = 1, index is 0 and index_finished == finished.
struct StreamDelta {
  int32_t index = 0;
  // Completion `index` ended with this delta: finish_reason, error and
  // timings are its own; usage too unless `finished`.
  bool index_finished = false;
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<TokenLogprobs> logprobs;  // one per token when requested
  // The stream's last delta (every completion ended). Its usage covers the
  // whole request: prompt tokens once, completion tokens of all completions.
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // for kError
  Usage usage;        // final values when finished
  Timings timings;    // final values when finished
};

}  // namespace kvserve::engine
