// Request: the scheduler-side state of one generation request: its prompt
// and generated token ids, how many of them the KV cache already holds
// (`num_computed_tokens`, which chases `num_tokens()`), its limits, priority
// and lifecycle status. It owns no KV blocks (KvCacheManager does, by id),
// no proto types, and no sampling parameters beyond max_tokens (the engine
// keeps those and decides stop conditions).
//
// Invariants: 0 <= num_computed_tokens <= num_tokens();
// num_output_tokens() <= max_tokens; prompt non-empty.
//
// Thread safety: none. Created anywhere, then owned by the Scheduler and used
// on the engine thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kvcache/kv_cache_manager.h"

namespace kvserve::scheduler {

using RequestId = kvcache::RequestId;

enum class RequestStatus {
  kWaiting,    // queued, never admitted
  kRunning,    // admitted: holds blocks, scheduled each step while budget lasts
  kPreempted,  // back in the waiting queue after losing its blocks (by
               // recompute: computed tokens reset to 0; by swap: it keeps
               // them and holds swap slots)
  kFinishedStopped,  // engine saw a stop condition (EOS, stop string)
  kFinishedLength,   // reached max_tokens
  kFinishedAborted,  // client cancel, deadline, error, or shutdown
};

// Why a request ended: the one enum of the scheduler, the engine (which
// names it engine::FinishReason) and the server's wire mappings. The
// scheduler retires kStop and kLength as such and every other reason as
// aborted. The values are in the order of the engine's per-reason metrics.
enum class FinishReason {
  kNone,       // not finished (a stream delta before the last)
  kStop,       // a stop condition: EOS, stop token or stop string
  kLength,     // max_tokens reached
  kCancelled,  // client cancel, or shutdown
  kDeadline,   // the request's deadline passed
  kError,      // an engine error (e.g. a failed forward)
};

// What a request cost the KV cache over its life (the scheduler's part of
// the per-request accounting; the engine adds the times).
struct RequestKvStats {
  int32_t peak_blocks = 0;  // most blocks its table held at once
  int32_t preemptions_recompute = 0;
  int32_t preemptions_swap = 0;
  // Computed tokens its recompute preemptions discarded.
  int64_t recomputed_tokens = 0;
  int64_t swapped_out_blocks = 0;
  int64_t swapped_in_blocks = 0;
  // Tokens whose KV a bounded policy (KvWindow) dropped, summed over its
  // life (a recomputed request drops its tokens again).
  int64_t dropped_tokens = 0;
};

// A bounded KV policy. "streaming" (StreamingLLM): the request keeps the KV
// of its first `sinks` tokens (rounded up to whole blocks) and of at least
// its last `window` tokens; older blocks between them are dropped whole, so
// its pages stay flat however long it runs; positions are those within the
// cache (ForwardBatch::sink_lens). "heavy_hitters" (H2O at block
// granularity, budget > 0): it holds at most `budget` tokens, dropping past
// that the blocks between the sinks' and the last `window` tokens whose
// accumulated attention mass is lowest (HeavyHitterDrops); its tokens keep
// the positions they were written at. window == 0: the full cache.
struct KvWindow {
  int32_t sinks = 0;
  int32_t window = 0;
  int32_t budget = 0;  // heavy_hitters only: most KV tokens held
  [[nodiscard]] bool enabled() const { return window > 0; }
  [[nodiscard]] bool heavy_hitters() const { return budget > 0; }
  // The blocks kept from the start: the sinks, rounded up to whole blocks.
  [[nodiscard]] int32_t SinkBlocks(int32_t block_size) const {
    return (sinks + block_size - 1) / block_size;
  }
};

// What a KvWindow drops from a sequence whose KV holds `computed` tokens of
// which `dropped` already left: its table entries [first, first + count),
// first being the block after the sinks' blocks (count 0: nothing). Only
// whole blocks all of whose tokens precede the last `window` computed ones.
// The one rule the scheduler, `kvserve eval` and the tests apply.
struct WindowDrop {
  int32_t first = 0;
  int32_t count = 0;
};
[[nodiscard]] inline WindowDrop BlocksOutOfWindow(const KvWindow& w,
                                                  int32_t computed,
                                                  int32_t dropped,
                                                  int32_t block_size) {
  const int32_t sink_blocks = w.SinkBlocks(block_size);
  // Absolute index of the oldest block past the sinks still held.
  const int32_t oldest = sink_blocks + dropped / block_size;
  const int32_t keep_from = computed - w.window;
  return {sink_blocks, std::max(0, keep_from / block_size - oldest)};
}

// A heavy hitter's score per table entry: the attention mass its keys drew
// (ForwardOutput::block_mass, summed over steps) per query token that saw
// it. The plain sum (H2O's) favours old blocks, which more queries saw:
// on the default model at 8K and a 25% budget it lost to a window (mean
// KLD 0.039 against 0.036) where the mean beats it (0.032;
// docs/PERFORMANCE.md).
[[nodiscard]] inline std::vector<float> MeanAttention(
    absl::Span<const float> mass, absl::Span<const float> seen) {
  std::vector<float> out(mass.size());
  for (size_t b = 0; b < mass.size(); ++b) {
    out[b] = mass[b] / std::max(1.0f, b < seen.size() ? seen[b] : 0.0f);
  }
  return out;
}

// What a heavy-hitters KvWindow drops from a table holding `held` KV tokens
// whose entry b scores mass[b] (MeanAttention): table entries, highest
// index first (so removing them in order keeps the rest valid), until at
// most `budget` tokens remain. Candidates are the entries past the sinks'
// blocks all of whose tokens precede the last `window` held ones, lowest
// score first, ties to the oldest. The one rule of the scheduler, `kvserve
// eval` and the tests.
[[nodiscard]] inline std::vector<int32_t> HeavyHitterDrops(
    const KvWindow& w, int32_t held, absl::Span<const float> mass,
    int32_t block_size) {
  std::vector<int32_t> out;
  const int32_t first = w.SinkBlocks(block_size);
  const int32_t limit = std::min(std::max(0, (held - w.window) / block_size),
                                 static_cast<int32_t>(mass.size()));
  if (held <= w.budget || limit <= first) return out;
  std::vector<int32_t> order(limit - first);
  for (int32_t b = first; b < limit; ++b) order[b - first] = b;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return mass[a] < mass[b]; });
  for (int32_t excess = held - w.budget;
       excess > 0 && out.size() < order.size(); excess -= block_size) {
    out.push_back(order[out.size()]);
  }
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

// Who a request belongs to, as fair sharing needs it (the server resolves
// it from the bearer token). Requests of one name are one tenant; the
// latest request's weight and cap are the tenant's.
struct TenantPolicy {
  std::string name;
  // Share of running sequences and prefill tokens among tenants with work.
  int32_t weight = 1;
  // Sequences it may run at once; 0: only max_num_seqs bounds it.
  int32_t max_running = 0;
};

[[nodiscard]] absl::string_view RequestStatusName(RequestStatus status);
// A C string (static storage) so that it formats in logs and metric labels.
[[nodiscard]] const char* FinishReasonName(FinishReason reason);

class Request {
 public:
  // `priority`: lower value = more important (only the priority policy reads
  // it). `arrival_time_ns`: the caller's clock, for queue-time metrics.
  // Validity (non-empty prompt, max_tokens >= 1) is checked by
  // Scheduler::AddRequest, not here.
  Request(RequestId id, std::vector<int32_t> prompt_token_ids,
          int32_t max_tokens, int32_t priority = 0,
          int64_t arrival_time_ns = 0);

  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  [[nodiscard]] RequestId id() const { return id_; }
  [[nodiscard]] const std::vector<int32_t>& prompt_token_ids() const {
    return prompt_;
  }
  [[nodiscard]] const std::vector<int32_t>& output_token_ids() const {
    return output_;
  }
  // Replaces the output tokens: for a fork child (Scheduler::Fork), its own
  // first sampled token(s). Only before AddRequest / Fork.
  void set_output_token_ids(std::vector<int32_t> tokens) {
    output_ = std::move(tokens);
  }
  [[nodiscard]] int32_t num_prompt_tokens() const {
    return static_cast<int32_t>(prompt_.size());
  }
  [[nodiscard]] int32_t num_output_tokens() const {
    return static_cast<int32_t>(output_.size());
  }
  // Prompt + output: what the KV cache must eventually hold.
  [[nodiscard]] int32_t num_tokens() const {
    return num_prompt_tokens() + num_output_tokens();
  }
  // Token `i` of prompt + output. Precondition: 0 <= i < num_tokens().
  [[nodiscard]] int32_t token(int32_t i) const {
    return i < num_prompt_tokens() ? prompt_[i]
                                   : output_[i - num_prompt_tokens()];
  }
  // Tokens whose K/V are in the cache.
  [[nodiscard]] int32_t num_computed_tokens() const {
    return num_computed_tokens_;
  }
  // Tokens of the prompt found in the prefix cache at its first admission
  // (0 before it, or with prefix caching off). Readmissions after a
  // preemption match again but do not change it.
  [[nodiscard]] int32_t num_cached_tokens() const { return num_cached_tokens_; }
  // Scopes prefix-cache sharing: requests share cached KV blocks only when
  // their scopes, their salts (and the scheduler's model id) are equal.
  // Empty by default. Set before AddRequest.
  [[nodiscard]] const std::string& cache_salt() const { return cache_salt_; }
  void set_cache_salt(std::string salt) { cache_salt_ = std::move(salt); }
  // The tenant's prefix-cache scope (the server's TenantTable). A scope
  // several tenants share matches whole blocks only: no cached tail, so a
  // hit never tells another tenant's next token. Set before AddRequest.
  [[nodiscard]] const std::string& cache_scope() const { return cache_scope_; }
  [[nodiscard]] bool scope_shared() const { return scope_shared_; }
  void set_cache_scope(std::string scope, bool shared) {
    cache_scope_ = std::move(scope);
    scope_shared_ = shared;
  }
  // Its bounded KV policy (none by default). Set before AddRequest.
  [[nodiscard]] const KvWindow& kv_window() const { return kv_window_; }
  void set_kv_window(KvWindow window) { kv_window_ = window; }
  // Tokens dropped from its KV now (whole blocks, after the sinks' blocks):
  // with d of them, its token t >= d + sink tokens lives at KV index t - d.
  [[nodiscard]] int32_t kv_dropped_tokens() const { return kv_dropped_tokens_; }
  // Tokens its block table holds: computed less dropped.
  [[nodiscard]] int32_t kv_tokens() const {
    return num_computed_tokens_ - kv_dropped_tokens_;
  }
  // Speculative decoding: tokens proposed to follow its last one, for its
  // next decode step (Scheduler::SetDraft; cleared by Schedule).
  [[nodiscard]] const std::vector<int32_t>& draft() const { return draft_; }
  [[nodiscard]] const TenantPolicy& tenant() const { return tenant_; }
  void set_tenant(TenantPolicy tenant) { tenant_ = std::move(tenant); }
  // Completions this request will become (n): its sequences count against
  // max_num_seqs from its admission, the children it still has to fork
  // included (Scheduler::Fork takes one each, EndForks the rest). Set
  // before AddRequest; 1 by default.
  void set_num_completions(int32_t n) { pending_forks_ = n > 1 ? n - 1 : 0; }
  // Sequences it holds a seat for: itself and its pending forks.
  [[nodiscard]] int32_t seats() const { return 1 + pending_forks_; }
  // Prompt then output tokens, as the KV cache manager reads them.
  [[nodiscard]] kvcache::TokenSequence tokens() const {
    return {prompt_, output_};
  }
  [[nodiscard]] int32_t max_tokens() const { return max_tokens_; }
  [[nodiscard]] int32_t priority() const { return priority_; }
  [[nodiscard]] int64_t arrival_time_ns() const { return arrival_time_ns_; }
  // Order of AddRequest calls, assigned by the scheduler (FCFS key).
  [[nodiscard]] int64_t arrival_seq() const { return arrival_seq_; }
  // Order of its latest admission (-1: never admitted).
  [[nodiscard]] int64_t admit_seq() const { return admit_seq_; }
  [[nodiscard]] RequestStatus status() const { return status_; }
  [[nodiscard]] bool is_finished() const;
  // Preemptions over its whole life (recompute and swap).
  [[nodiscard]] int32_t num_preemptions() const { return num_preemptions_; }
  [[nodiscard]] const RequestKvStats& kv_stats() const { return kv_stats_; }
  // Preemptions since it last caught up to its last token (thrash guard).
  [[nodiscard]] int32_t num_consecutive_preemptions() const {
    return consecutive_preemptions_;
  }

 private:
  friend class Scheduler;
  friend class FairShare;

  // Scheduler state that is not part of the request's contract.
  // rank: priority aged by arrival time (kPriority, kCacheAware; see
  // SchedulerConfig::priority_aging_seconds), 0 under kFcfs.
  struct QueueKey {
    double rank = 0;
    int64_t order = 0;
    RequestId id = 0;
    auto operator<=>(const QueueKey&) const = default;
  };

  RequestId id_;
  std::vector<int32_t> prompt_;
  std::vector<int32_t> output_;
  std::vector<int32_t> draft_;
  int32_t max_tokens_;
  int32_t priority_;
  int64_t arrival_time_ns_;
  int64_t arrival_seq_ = -1;
  int32_t num_computed_tokens_ = 0;
  int32_t num_cached_tokens_ = 0;
  KvWindow kv_window_;
  int32_t kv_dropped_tokens_ = 0;
  // Heavy hitters, per block table entry: attention mass summed over the
  // steps since it was written, and the query tokens of those steps
  // (Scheduler::AddBlockMass; MeanAttention).
  std::vector<float> kv_block_mass_, kv_block_seen_;
  int32_t num_preemptions_ = 0;
  int32_t consecutive_preemptions_ = 0;
  RequestKvStats kv_stats_;
  std::string cache_salt_;
  std::string cache_scope_;
  bool scope_shared_ = false;
  kvcache::BlockHash cache_ns_ = 0;  // NamespaceHash(model id, scope, salt)
  TenantPolicy tenant_;
  int32_t tenant_id_ = -1;  // FairShare's id while live
  int32_t pending_forks_ = 0;
  // kCacheAware: admissions that passed it over while it led its queue.
  int32_t times_passed_ = 0;
  RequestStatus status_ = RequestStatus::kWaiting;
  QueueKey queue_key_;      // its key in the waiting queue while waiting
  int64_t admit_seq_ = -1;  // order of its latest admission
};

}  // namespace kvserve::scheduler
