// Prometheus metrics the engine owns (names per DESIGN.md section 7). The
// engine thread updates them; prometheus-cpp makes collection from the
// HTTP thread safe. Created once per engine against the server's registry.
#pragma once

#include <memory>

#include "engine/request_spec.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace kvserve::engine {

struct CacheConfigInfo {
  int32_t block_size = 0;
  int32_t num_blocks = 0;
  int64_t bytes_per_token = 0;
  std::string kv_dtype;
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
  }
  void AddPreemptions(int64_t n) { preempt_recompute_->Increment(n); }
  void AddRecomputedTokens(int64_t n) { recomputed_tokens_->Increment(n); }
  void AddPromptTokens(int64_t n) { prompt_tokens_->Increment(n); }
  void AddGenerationTokens(int64_t n) { generation_tokens_->Increment(n); }
  void ObserveStep(double seconds, int64_t tokens);
  void ObserveTtft(double s) { ttft_->Observe(s); }
  void ObserveInterToken(double s) { itl_->Observe(s); }
  void ObserveQueueTime(double s) { queue_->Observe(s); }
  void Finished(FinishReason reason, double e2e_seconds);
  void Rejected() { rejected_->Increment(); }
  void AddPrefixCache(int64_t queried, int64_t hits) {
    prefix_queries_->Increment(queried);
    prefix_hits_->Increment(hits);
  }
  void AddUncacheableTokens(int64_t n) { prefix_uncacheable_->Increment(n); }

 private:
  prometheus::Gauge *blocks_active_, *blocks_cached_, *blocks_free_,
      *blocks_total_, *usage_, *reserved_, *unwritten_, *running_, *waiting_;
  prometheus::Counter *preempt_recompute_, *preempt_swap_, *recomputed_tokens_,
      *prompt_tokens_, *generation_tokens_, *steps_, *rejected_,
      *prefix_queries_, *prefix_hits_, *prefix_uncacheable_;
  prometheus::Counter* finished_[6];
  prometheus::Histogram *ttft_, *itl_, *e2e_, *queue_, *step_time_,
      *step_tokens_;
};

}  // namespace kvserve::engine
