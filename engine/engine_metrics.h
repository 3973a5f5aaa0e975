// Prometheus metrics the engine owns (kvserve_ prefix, base units, _total
// for counters; deploy/README.md lists them). The engine thread updates
// them; prometheus-cpp makes collection from the HTTP thread safe. Created
// once per engine against the server's registry.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "engine/request_spec.h"
#include "grammar/grammar_compiler.h"
#include "kvcache/block_pool.h"
#include "kvcache/kv_format.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "scheduler/scheduler.h"

namespace kvserve::engine {

struct CacheConfigInfo {
  int32_t block_size = 0;
  int32_t num_blocks = 0;
  int64_t bytes_per_token = 0;
  kvcache::KvDtype kv_dtype = kvcache::KvDtype::kBF16;
  int32_t num_swap_slots = 0;
  int64_t bytes_per_block = 0;
  std::string device;      // "cpu", "cuda:0", "sim:h200x2"
  bool simulated = false;  // the simulated device
  bool prefix_caching = true;
};

class EngineMetrics {
 public:
  EngineMetrics(prometheus::Registry& registry, const CacheConfigInfo& info);

  void SetKvBlocks(int64_t active, int64_t cached, int64_t free);
  // Token slots in the blocks of running requests, and those not yet
  // written: unwritten / reserved is the fraction of reserved KV wasted.
  void SetReservedSlots(int64_t reserved, int64_t unwritten) {
    reserved_->Set(reserved);
    unwritten_->Set(unwritten);
  }
  void SetQueues(int64_t running, int64_t waiting) {
    running_->Set(running);
    waiting_->Set(waiting);
    gie_running_->Set(running);
    gie_waiting_->Set(waiting);
  }
  // A step's preemptions by mode and reason.
  void AddPreemptions(const scheduler::StepStats& s);
  // Token slots by state; they sum to the capacity.
  void SetTokenSlots(int64_t written, int64_t unwritten, int64_t cached,
                     int64_t free);
  // Called on the engine thread for each evicted cached block.
  void ObserveEviction(const kvcache::Eviction& e);
  // Swap traffic in blocks (exported in bytes).
  void AddSwapBlocks(int64_t out, int64_t in) {
    swap_out_bytes_->Increment(static_cast<double>(out) * bytes_per_block_);
    swap_in_bytes_->Increment(static_cast<double>(in) * bytes_per_block_);
  }
  void SetSwapBlocks(int64_t used, int64_t total) {
    swap_used_->Set(used);
    swap_total_->Set(total);
  }
  // Prompt positions the model computed (prefill, including recompute
  // after preemption); prefix-cache hits are not computed.
  void AddPromptTokensComputed(int64_t n) { prompt_computed_->Increment(n); }
  void ObserveRequestPreemptions(int32_t n) {
    request_preemptions_->Observe(n);
  }
  void AddRecomputedTokens(int64_t n) { recomputed_tokens_->Increment(n); }
  void AddPromptTokens(int64_t n) { prompt_tokens_->Increment(n); }
  void AddGenerationTokens(int64_t n) { generation_tokens_->Increment(n); }
  // Speculative decoding: one verified draft of `drafted` tokens of which
  // `accepted` were kept.
  void AddSpeculation(int32_t drafted, int32_t accepted) {
    spec_draft_->Increment(drafted);
    spec_accepted_->Increment(accepted);
    spec_accept_len_->Observe(accepted);
  }
  void AddDraftModelSeconds(double s) { spec_draft_seconds_->Increment(s); }
  void AddDraftFailure() { spec_draft_failures_->Increment(); }
  // Structured output: rows masked by grammars in a step and their time.
  void AddGrammarMasks(int32_t masks, double seconds) {
    if (masks == 0) return;
    grammar_masks_->Increment(masks);
    grammar_mask_seconds_->Increment(seconds);
  }
  // The grammar compiler's running totals (counters advance by the change).
  void SetGrammarCompiles(const grammar::GrammarCompilerStats& s);
  void ObserveStep(double seconds, int64_t tokens);
  // Wall time inside the model forward pass; with the step histogram's sum
  // it gives the engine's overhead outside the forward.
  void AddForwardSeconds(double s) { forward_seconds_->Increment(s); }
  // int3/int2 key groups requantized from their codes (ForwardOutput).
  void AddKeyGroupsRebuilt(int64_t n) {
    if (n > 0) groups_rebuilt_->Increment(static_cast<double>(n));
  }
  void ObserveTtft(double s) { ttft_->Observe(s); }
  void ObserveInterToken(double s) { itl_->Observe(s); }
  void ObserveQueueTime(double s) { queue_->Observe(s); }
  void Finished(FinishReason reason, double e2e_seconds);
  void Rejected() { rejected_->Increment(); }
  // A request whose deadline passed: `running` if it had been scheduled
  // (consumed prefill), else it expired in the queue.
  void DeadlineExceeded(bool running) {
    (running ? deadline_running_ : deadline_queued_)->Increment();
  }
  void AddPrefixCache(int64_t queried, int64_t hits) {
    prefix_queries_->Increment(queried);
    prefix_hits_->Increment(hits);
  }
  void AddUncacheableTokens(int64_t n) { prefix_uncacheable_->Increment(n); }
  void AddTailHits(int64_t n) { prefix_tail_hits_->Increment(n); }
  void AddDroppedBlocks(int64_t n) { dropped_blocks_->Increment(n); }
  // Per tenant (label `tenant`: the token file's names, so the label set is
  // the operator's): a request that ended and what it used, and a refused
  // submission. Any thread.
  void TenantFinished(const std::string& tenant, const Usage& usage,
                      int32_t preemptions);
  void TenantRejected(const std::string& tenant);

 private:
  prometheus::Gauge *blocks_active_, *blocks_cached_, *blocks_free_,
      *blocks_total_, *usage_, *reserved_, *unwritten_, *running_, *waiting_;
  void RegisterKvVisibility(prometheus::Registry& r,
                            const CacheConfigInfo& info);

  prometheus::Counter* preempt_[2][2];  // [recompute, swap][reason]
  prometheus::Gauge* slots_[4];
  prometheus::Counter* evictions_[kvcache::kNumEvictReasons];
  prometheus::Histogram *evicted_age_, *evicted_reuses_;
  prometheus::Counter *recomputed_tokens_, *prompt_tokens_, *generation_tokens_,
      *steps_, *rejected_, *prefix_queries_, *prefix_hits_,
      *prefix_uncacheable_, *prefix_tail_hits_, *forward_seconds_,
      *dropped_blocks_, *groups_rebuilt_;
  prometheus::Counter* finished_[6];
  prometheus::Gauge *swap_used_, *swap_total_, *blocks_active_peak_;
  prometheus::Counter *swap_out_bytes_, *swap_in_bytes_, *prompt_computed_;
  prometheus::Histogram* request_preemptions_;
  prometheus::Counter *spec_draft_, *spec_accepted_, *spec_draft_seconds_,
      *spec_draft_failures_;
  prometheus::Histogram* spec_accept_len_;
  prometheus::Counter *grammar_masks_, *grammar_mask_seconds_;
  prometheus::Counter*
      grammar_compiles_[5];  // ok, failed, cached, timeout, busy
  prometheus::Gauge* grammar_cache_bytes_;
  absl::Mutex grammar_mu_;  // SetGrammarCompiles runs on callers' threads
  grammar::GrammarCompilerStats grammar_seen_ ABSL_GUARDED_BY(grammar_mu_);
  int64_t bytes_per_block_ = 0;
  prometheus::Counter *deadline_queued_, *deadline_running_;
  prometheus::Family<prometheus::Counter>*tenant_requests_, *tenant_prompt_,
      *tenant_generation_, *tenant_cached_, *tenant_preemptions_,
      *tenant_rejected_;
  void RegisterTenants(prometheus::Registry& r);
  // The Gateway API Inference Extension's model-server protocol, under
  // vLLM's names, so an endpoint picker reads kvserve unconfigured.
  void RegisterGieProtocol(prometheus::Registry& r,
                           const CacheConfigInfo& info);
  prometheus::Gauge *gie_running_, *gie_waiting_, *gie_usage_, *gie_usage_old_;
  prometheus::Histogram *ttft_, *itl_, *e2e_, *queue_, *step_time_,
      *step_tokens_;
};

}  // namespace kvserve::engine
