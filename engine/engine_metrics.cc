#include "engine/engine_metrics.h"

#include "absl/strings/str_cat.h"

namespace kvserve::engine {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
          0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0, 120.0};
}

}  // namespace

EngineMetrics::EngineMetrics(prometheus::Registry& r,
                             const CacheConfigInfo& info) {
  RegisterTenants(r);
  RegisterGieProtocol(r, info);
  auto& blocks = BuildGauge()
                     .Name("kvserve_kv_blocks")
                     .Help(
                         "KV cache blocks by state; active + cached + free "
                         "= kvserve_kv_blocks_capacity")
                     .Register(r);
  blocks_active_ = &blocks.Add({{"state", "active"}});
  blocks_cached_ = &blocks.Add({{"state", "cached"}});
  blocks_free_ = &blocks.Add({{"state", "free"}});
  blocks_total_ = &BuildGauge()
                       .Name("kvserve_kv_blocks_capacity")
                       // NOTE: not `_total`: promtool reserves that suffix
                       // for counters.
                       .Help("KV cache blocks in the pool")
                       .Register(r)
                       .Add({});
  blocks_total_->Set(info.num_blocks);
  usage_ = &BuildGauge()
                .Name("kvserve_kv_cache_usage_ratio")
                .Help("Fraction of KV blocks held by requests (0..1)")
                .Register(r)
                .Add({});
  reserved_ = &BuildGauge()
                   .Name("kvserve_kv_reserved_slots")
                   .Help(
                       "Token slots in the blocks allocated to running "
                       "requests")
                   .Register(r)
                   .Add({});
  unwritten_ = &BuildGauge()
                    .Name("kvserve_kv_reserved_unwritten_slots")
                    .Help(
                        "Token slots in allocated blocks not yet written "
                        "(internal fragmentation)")
                    .Register(r)
                    .Add({});
  auto& reqs = BuildGauge()
                   .Name("kvserve_requests")
                   .Help("Requests in the engine by state")
                   .Register(r);
  running_ = &reqs.Add({{"state", "running"}});
  waiting_ = &reqs.Add({{"state", "waiting"}});
  RegisterKvVisibility(r, info);
  recomputed_tokens_ = &BuildCounter()
                            .Name("kvserve_preemption_recomputed_tokens_total")
                            .Help(
                                "Tokens whose KV was dropped by preemption "
                                "and must be recomputed")
                            .Register(r)
                            .Add({});
  prompt_tokens_ = &BuildCounter()
                        .Name("kvserve_prompt_tokens_total")
                        .Help("Prompt tokens of admitted requests")
                        .Register(r)
                        .Add({});
  generation_tokens_ = &BuildCounter()
                            .Name("kvserve_generation_tokens_total")
                            .Help("Tokens generated")
                            .Register(r)
                            .Add({});
  steps_ = &BuildCounter()
                .Name("kvserve_engine_steps_total")
                .Help("Engine steps (batched forward passes)")
                .Register(r)
                .Add({});
  rejected_ = &BuildCounter()
                   .Name("kvserve_requests_rejected_total")
                   .Help(
                       "Requests refused at submission (queue full, too "
                       "long, draining)")
                   .Register(r)
                   .Add({});
  prefix_queries_ = &BuildCounter()
                         .Name("kvserve_prefix_cache_queries_tokens_total")
                         .Help("Prompt tokens looked up in the prefix cache")
                         .Register(r)
                         .Add({});
  prefix_hits_ = &BuildCounter()
                      .Name("kvserve_prefix_cache_hits_tokens_total")
                      .Help("Prompt tokens served from the prefix cache")
                      .Register(r)
                      .Add({});
  prefix_uncacheable_ =
      &BuildCounter()
           .Name("kvserve_prefix_cache_uncacheable_tokens_total")
           .Help(
               "Prompt tokens in a partial last block, which no block hash "
               "covers (a later request may hit them as a cached tail)")
           .Register(r)
           .Add({});
  prefix_tail_hits_ =
      &BuildCounter()
           .Name("kvserve_prefix_cache_tail_hits_total")
           .Help(
               "Prefix hits that also took the first tokens of a cached "
               "partial block, each by one block copy")
           .Register(r)
           .Add({});
  dropped_blocks_ =
      &BuildCounter()
           .Name("kvserve_kv_policy_dropped_blocks_total")
           .Help(
               "KV blocks that requests' bounded kv_policy (streaming) "
               "dropped past their window")
           .Register(r)
           .Add({});
  groups_rebuilt_ =
      &BuildCounter()
           .Name("kvserve_kv_key_groups_rebuilt_total")
           .Help(
               "int3/int2 key groups whose exact keys were gone (swapped out "
               "or evicted from the model's stage) and were requantized from "
               "their codes, a small loss of precision")
           .Register(r)
           .Add({});
  forward_seconds_ = &BuildCounter()
                          .Name("kvserve_engine_forward_seconds_total")
                          .Help("Wall time spent in the model forward pass")
                          .Register(r)
                          .Add({});
  auto& deadline = BuildCounter()
                       .Name("kvserve_deadline_exceeded_total")
                       .Help(
                           "Requests stopped by their deadline, by phase: "
                           "queued (never scheduled) or running")
                       .Register(r);
  deadline_queued_ = &deadline.Add({{"phase", "queued"}});
  deadline_running_ = &deadline.Add({{"phase", "running"}});
  bytes_per_block_ = info.bytes_per_block;
  auto& swap = BuildGauge()
                   .Name("kvserve_swap_blocks")
                   .Help(
                       "Host swap space in KV blocks: used (holding a "
                       "preempted request's blocks) and total")
                   .Register(r);
  swap_used_ = &swap.Add({{"state", "used"}});
  swap_total_ = &swap.Add({{"state", "total"}});
  swap_total_->Set(info.num_swap_slots);
  auto& swap_bytes = BuildCounter()
                         .Name("kvserve_swap_bytes_total")
                         .Help(
                             "KV bytes copied to (out) and from (in) the "
                             "host swap space")
                         .Register(r);
  swap_out_bytes_ = &swap_bytes.Add({{"direction", "out"}});
  swap_in_bytes_ = &swap_bytes.Add({{"direction", "in"}});
  prompt_computed_ = &BuildCounter()
                          .Name("kvserve_prompt_tokens_computed_total")
                          .Help(
                              "Prompt tokens the model computed (prefill, "
                              "including recompute after preemption; "
                              "prefix-cache hits excluded)")
                          .Register(r)
                          .Add({});
  blocks_active_peak_ = &BuildGauge()
                             .Name("kvserve_kv_blocks_active_peak")
                             .Help(
                                 "Most KV blocks held by requests at once "
                                 "since start-up")
                             .Register(r)
                             .Add({});
  request_preemptions_ =
      &BuildHistogram()
           .Name("kvserve_request_preemptions")
           .Help("Times each finished request was preempted")
           .Register(r)
           .Add({}, Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32});
  spec_draft_ = &BuildCounter()
                     .Name("kvserve_spec_decode_draft_tokens_total")
                     .Help("Draft tokens verified by speculative decoding")
                     .Register(r)
                     .Add({});
  spec_accepted_ =
      &BuildCounter()
           .Name("kvserve_spec_decode_accepted_tokens_total")
           .Help(
               "Draft tokens speculative decoding accepted (the rest, "
               "draft less accepted, were computed in vain)")
           .Register(r)
           .Add({});
  spec_accept_len_ =
      &BuildHistogram()
           .Name("kvserve_spec_decode_acceptance_length")
           .Help("Draft tokens accepted per verified draft")
           .Register(r)
           .Add({}, Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16});
  spec_draft_seconds_ =
      &BuildCounter()
           .Name("kvserve_spec_decode_draft_model_seconds_total")
           .Help(
               "Wall time of the draft model's forwards (--speculative "
               "draft), inside the engine step")
           .Register(r)
           .Add({});
  spec_draft_failures_ =
      &BuildCounter()
           .Name("kvserve_spec_decode_draft_failures_total")
           .Help("Steps whose draft model failed (they ran without drafts)")
           .Register(r)
           .Add({});
  grammar_masks_ =
      &BuildCounter()
           .Name("kvserve_structured_output_masks_total")
           .Help("Logits rows masked by a structured-output grammar")
           .Register(r)
           .Add({});
  grammar_mask_seconds_ =
      &BuildCounter()
           .Name("kvserve_structured_output_mask_seconds_total")
           .Help(
               "Engine-thread time computing and applying grammar masks "
               "(divide by the masks for the time per token)")
           .Register(r)
           .Add({});
  auto& compiles =
      BuildCounter()
          .Name("kvserve_structured_output_compiles_total")
          .Help(
              "Structured-output grammar requests by result: compiled, "
              "failed (an invalid schema or grammar), cached (a repeated "
              "one), timeout (the caller stopped waiting), busy (refused "
              "at --structured-output-max-compiles)")
          .Register(r);
  const char* results[] = {"compiled", "failed", "cached", "timeout", "busy"};
  for (int i = 0; i < 5; ++i) {
    grammar_compiles_[i] = &compiles.Add({{"result", results[i]}});
  }
  grammar_cache_bytes_ =
      &BuildGauge()
           .Name("kvserve_structured_output_cache_bytes")
           .Help("Compiled grammars kept for reuse, in bytes")
           .Register(r)
           .Add({});
  auto& fin = BuildCounter()
                  .Name("kvserve_requests_finished_total")
                  .Help("Finished requests by reason")
                  .Register(r);
  for (int i = 0; i < 6; ++i) {
    finished_[i] =
        &fin.Add({{"reason", FinishReasonName(static_cast<FinishReason>(i))}});
  }
  auto hist = [&](const char* name, const char* help,
                  const Histogram::BucketBoundaries& b) {
    return &BuildHistogram().Name(name).Help(help).Register(r).Add({}, b);
  };
  ttft_ = hist("kvserve_time_to_first_token_seconds",
               "Arrival to first generated token", LatencyBuckets());
  itl_ = hist("kvserve_inter_token_latency_seconds",
              "Time between consecutive tokens of a request", LatencyBuckets());
  e2e_ = hist("kvserve_e2e_request_latency_seconds", "Arrival to finish",
              LatencyBuckets());
  queue_ = hist("kvserve_request_queue_time_seconds",
                "Arrival to first scheduled", LatencyBuckets());
  step_time_ = hist("kvserve_engine_step_duration_seconds",
                    "Wall time of one engine step", LatencyBuckets());
  step_tokens_ = hist("kvserve_engine_step_tokens", "Tokens per engine step",
                      {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048});
  BuildGauge()
      .Name("kvserve_cache_config_info")
      .Help("KV cache configuration (value is always 1)")
      .Register(r)
      .Add({{"block_size", absl::StrCat(info.block_size)},
            {"num_blocks", absl::StrCat(info.num_blocks)},
            {"bytes_per_token", absl::StrCat(info.bytes_per_token)},
            {"kv_dtype", std::string(kvcache::KvDtypeName(info.kv_dtype))},
            {"device", info.device},
            {"simulated", info.simulated ? "true" : "false"}})
      .Set(1);
}

void EngineMetrics::RegisterKvVisibility(prometheus::Registry& r,
                                         const CacheConfigInfo& info) {
  auto& pre = BuildCounter()
                  .Name("kvserve_preemptions_total")
                  .Help(
                      "Requests preempted to free KV blocks, by mode and "
                      "reason (no_free_block: a running request's next "
                      "tokens; priority: a waiting request of higher "
                      "priority)")
                  .Register(r);
  for (int m = 0; m < 2; ++m) {
    for (int k = 0; k < 2; ++k) {
      preempt_[m][k] =
          &pre.Add({{"mode", m == 0 ? "recompute" : "swap"},
                    {"reason", k == 0 ? "no_free_block" : "priority"}});
    }
  }
  auto& slots = BuildGauge()
                    .Name("kvserve_kv_token_slots")
                    .Help(
                        "KV token slots by state (shared blocks once): "
                        "active_written + active_unwritten + cached + free "
                        "= kvserve_kv_token_slots_capacity")
                    .Register(r);
  for (int i = 0; i < 4; ++i) {
    static constexpr const char* kStates[] = {
        "active_written", "active_unwritten", "cached", "free"};
    slots_[i] = &slots.Add({{"state", kStates[i]}});
  }
  BuildGauge()
      .Name("kvserve_kv_token_slots_capacity")
      .Help("KV token slots in the pool (blocks * block size)")
      .Register(r)
      .Add({})
      .Set(static_cast<double>(info.num_blocks) * info.block_size);
  auto& ev = BuildCounter()
                 .Name("kvserve_kv_evictions_total")
                 .Help(
                     "Cached KV blocks evicted for new content, by what "
                     "needed the block")
                 .Register(r);
  for (int i = 0; i < kvcache::kNumEvictReasons; ++i) {
    evictions_[i] = &ev.Add(
        {{"reason",
          kvcache::EvictReasonName(static_cast<kvcache::EvictReason>(i))}});
  }
  evicted_age_ =
      &BuildHistogram()
           .Name("kvserve_kv_evicted_block_age_seconds")
           .Help("Seconds a cached block stayed evictable before eviction")
           .Register(r)
           .Add({}, Histogram::BucketBoundaries{0.01, 0.1, 1, 5, 15, 60, 300,
                                                900, 3600, 14400, 86400});
  evicted_reuses_ =
      &BuildHistogram()
           .Name("kvserve_kv_evicted_block_reuses")
           .Help("Prefix-cache hits an evicted block served while cached")
           .Register(r)
           .Add({}, Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 64, 256});
}

void EngineMetrics::AddPreemptions(const scheduler::StepStats& s) {
  preempt_[0][1]->Increment(
      static_cast<double>(s.priority_preemptions_recompute));
  preempt_[1][1]->Increment(static_cast<double>(s.priority_preemptions_swap));
  preempt_[0][0]->Increment(static_cast<double>(
      s.preemptions_recompute - s.priority_preemptions_recompute));
  preempt_[1][0]->Increment(
      static_cast<double>(s.preemptions_swap - s.priority_preemptions_swap));
}

void EngineMetrics::SetTokenSlots(int64_t written, int64_t unwritten,
                                  int64_t cached, int64_t free) {
  slots_[0]->Set(static_cast<double>(written));
  slots_[1]->Set(static_cast<double>(unwritten));
  slots_[2]->Set(static_cast<double>(cached));
  slots_[3]->Set(static_cast<double>(free));
}

void EngineMetrics::ObserveEviction(const kvcache::Eviction& e) {
  evictions_[static_cast<int>(e.reason)]->Increment();
  evicted_age_->Observe(e.age_seconds);
  evicted_reuses_->Observe(e.reuses);
}

void EngineMetrics::SetKvBlocks(int64_t active, int64_t cached, int64_t free) {
  blocks_active_->Set(active);
  blocks_cached_->Set(cached);
  blocks_free_->Set(free);
  if (active > blocks_active_peak_->Value()) blocks_active_peak_->Set(active);
  const double total = active + cached + free;
  usage_->Set(total > 0 ? active / total : 0.0);
  gie_usage_->Set(usage_->Value());
  gie_usage_old_->Set(usage_->Value());
}

// GIE's docs/proposals/003-model-server-protocol: queued and running
// requests and KV utilization (a fraction, 0..1) as gauges; the block size
// and block count as labels of an info gauge. vLLM renamed
// gpu_cache_usage_perc to kv_cache_usage_perc in 0.10 while the picker's
// default kept the old name: both are exported.
void EngineMetrics::RegisterGieProtocol(prometheus::Registry& r,
                                        const CacheConfigInfo& info) {
  auto gauge = [&r](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(r).Add({});
  };
  gie_waiting_ = gauge("vllm:num_requests_waiting",
                       "Requests waiting (GIE model-server protocol)");
  gie_running_ = gauge("vllm:num_requests_running",
                       "Requests running (GIE model-server protocol)");
  gie_usage_ = gauge("vllm:kv_cache_usage_perc",
                     "Fraction of KV blocks in use, 0..1 (GIE protocol)");
  gie_usage_old_ = gauge("vllm:gpu_cache_usage_perc",
                         "vllm:kv_cache_usage_perc's name before vLLM 0.10");
  BuildGauge()
      .Name("vllm:cache_config_info")
      .Help("KV cache configuration (GIE protocol; value is always 1)")
      .Register(r)
      .Add({{"block_size", absl::StrCat(info.block_size)},
            {"num_gpu_blocks", absl::StrCat(info.num_blocks)},
            {"cache_dtype", std::string(kvcache::KvDtypeName(info.kv_dtype))},
            {"enable_prefix_caching", info.prefix_caching ? "True" : "False"}})
      .Set(1);
}

void EngineMetrics::ObserveStep(double seconds, int64_t tokens) {
  steps_->Increment();
  step_time_->Observe(seconds);
  step_tokens_->Observe(static_cast<double>(tokens));
}

void EngineMetrics::Finished(FinishReason reason, double e2e_seconds) {
  finished_[static_cast<int>(reason)]->Increment();
  e2e_->Observe(e2e_seconds);
}

void EngineMetrics::RegisterTenants(prometheus::Registry& r) {
  auto counter = [&r](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(r);
  };
  tenant_requests_ = counter("kvserve_tenant_requests_total",
                             "Requests that ended, by tenant");
  tenant_prompt_ = counter("kvserve_tenant_prompt_tokens_total",
                           "Prompt tokens of ended requests, by tenant");
  tenant_generation_ = counter("kvserve_tenant_generation_tokens_total",
                               "Generated tokens of ended requests, by tenant");
  tenant_cached_ =
      counter("kvserve_tenant_cached_prompt_tokens_total",
              "Prompt tokens served from the prefix cache, by tenant");
  tenant_preemptions_ = counter("kvserve_tenant_preemptions_total",
                                "Preemptions of ended requests, by tenant");
  tenant_rejected_ =
      counter("kvserve_tenant_rejected_total",
              "Submissions refused (queue or tenant limits), by tenant");
}

void EngineMetrics::TenantFinished(const std::string& tenant,
                                   const Usage& usage, int32_t preemptions) {
  const std::map<std::string, std::string> label = {{"tenant", tenant}};
  tenant_requests_->Add(label).Increment();
  tenant_prompt_->Add(label).Increment(usage.prompt_tokens);
  tenant_generation_->Add(label).Increment(usage.completion_tokens);
  tenant_cached_->Add(label).Increment(usage.cached_prompt_tokens);
  tenant_preemptions_->Add(label).Increment(preemptions);
}

void EngineMetrics::TenantRejected(const std::string& tenant) {
  tenant_rejected_->Add({{"tenant", tenant}}).Increment();
}

void EngineMetrics::SetGrammarCompiles(const grammar::GrammarCompilerStats& s) {
  absl::MutexLock lock(&grammar_mu_);
  const grammar::GrammarCompilerStats& p = grammar_seen_;
  const int64_t now[] = {s.compiles - s.failures, s.failures, s.cache_hits,
                         s.timeouts, s.busy};
  const int64_t before[] = {p.compiles - p.failures, p.failures, p.cache_hits,
                            p.timeouts, p.busy};
  for (int i = 0; i < 5; ++i) {
    if (now[i] > before[i]) {
      grammar_compiles_[i]->Increment(static_cast<double>(now[i] - before[i]));
    }
  }
  grammar_cache_bytes_->Set(static_cast<double>(s.cache_bytes));
  grammar_seen_ = s;
}

}  // namespace kvserve::engine
