#include "server/proto_convert.h"

#include <string>

#include "kvcache/kv_format.h"

namespace kvserve::server {
namespace {

void FillLogprobs(const engine::TokenLogprobs& lp,
                  const models::Tokenizer& tokenizer, v1::TokenLogprobs* out) {
  out->set_token(lp.token);
  out->set_logprob(lp.logprob);
  out->set_piece(tokenizer.TokenToPiece(lp.token));
  for (const engine::TokenLogprob& top : lp.top) {
    v1::TokenLogprob* t = out->add_top();
    t->set_token(top.token);
    t->set_logprob(top.logprob);
    t->set_piece(tokenizer.TokenToPiece(top.token));
  }
}

}  // namespace

v1::FinishReason ToProto(engine::FinishReason reason) {
  using engine::FinishReason;
  switch (reason) {
    case FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kDeadline:
      return v1::FINISH_REASON_DEADLINE;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

void ToProto(const engine::StreamDelta& delta,
             const models::Tokenizer& tokenizer, v1::GenerateResponse* out) {
  out->Clear();
  out->mutable_token_ids()->Add(delta.token_ids.begin(), delta.token_ids.end());
  out->set_text(delta.text);
  for (const engine::TokenLogprobs& lp : delta.logprobs) {
    FillLogprobs(lp, tokenizer, out->add_logprobs());
  }
  out->set_index(delta.index);
  if (!delta.index_finished && !delta.finished) return;
  out->set_finish_reason(ToProto(delta.finish_reason));
  if (delta.finished) {
    v1::Usage* usage = out->mutable_usage();
    usage->set_prompt_tokens(delta.usage.prompt_tokens);
    usage->set_completion_tokens(delta.usage.completion_tokens);
    usage->set_cached_prompt_tokens(delta.usage.cached_prompt_tokens);
    const engine::KvUsage& kv = delta.usage.kv;
    v1::KvUsage* k = usage->mutable_kv();
    if (kv.kv_dtype.has_value()) {
      k->set_kv_dtype(std::string(kvcache::KvDtypeName(*kv.kv_dtype)));
    }
    k->set_peak_blocks(kv.peak_blocks);
    k->set_peak_bytes(kv.peak_bytes);
    k->set_preemptions_recompute(kv.preemptions_recompute);
    k->set_preemptions_swap(kv.preemptions_swap);
    k->set_recomputed_tokens(kv.recomputed_tokens);
    k->set_dropped_tokens(kv.dropped_tokens);
    k->set_draft_tokens(kv.draft_tokens);
    k->set_accepted_draft_tokens(kv.accepted_draft_tokens);
    k->set_swapped_out_bytes(kv.swapped_out_bytes);
    k->set_swapped_in_bytes(kv.swapped_in_bytes);
    k->set_queued_seconds(kv.queued_seconds);
    k->set_preempted_seconds(kv.preempted_seconds);
    v1::CachedTokensByTier* tiers = k->mutable_cached_tokens_by_tier();
    tiers->set_device(kv.cached_tokens_device);
    tiers->set_host(kv.cached_tokens_host);
    tiers->set_disk(kv.cached_tokens_disk);
    tiers->set_remote(kv.cached_tokens_remote);
  }
  v1::Timings* timings = out->mutable_timings();
  timings->set_queue_seconds(delta.timings.queue_seconds);
  timings->set_time_to_first_token_seconds(delta.timings.time_to_first_token);
  timings->set_total_seconds(delta.timings.total_seconds);
}

void ToProto(const engine::ModelInfo& info, v1::ModelInfo* out) {
  out->set_name(info.name);
  out->set_path(info.path);
  out->set_format(info.format);
  out->set_architecture(info.architecture);
  out->set_num_layers(info.num_layers);
  out->set_hidden_size(info.hidden_size);
  out->set_num_heads(info.num_heads);
  out->set_num_kv_heads(info.num_kv_heads);
  out->set_head_dim(info.head_dim);
  out->set_intermediate_size(info.intermediate_size);
  out->set_vocab_size(info.vocab_size);
  out->set_max_context(info.max_context);
  out->set_kv_bytes_per_token(info.kv_bytes_per_token);
  out->set_block_size(info.block_size);
  out->set_num_blocks(info.num_blocks);
  out->set_kv_dtype(std::string(kvcache::KvDtypeName(info.kv_dtype)));
  out->set_device(info.device);
  out->set_simulated(info.simulated);
}

}  // namespace kvserve::server
