// ModelRunner: block moves, batch construction, forward and sampling of one
// engine step. See model_runner.h.
#include "engine/runner/model_runner.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"

namespace kvserve::engine {

ModelRunner::ModelRunner(std::unique_ptr<ModelBackend> backend,
                         int32_t block_size, int32_t vocab_size,
                         absl::Duration fault_step_delay, const Clock* clock)
    : backend_(std::move(backend)),
      block_size_(block_size),
      vocab_size_(vocab_size),
      fault_step_delay_(fault_step_delay),
      clock_(clock) {}

absl::Status ModelRunner::AddRequest(
    RequestId id, const SamplingParams& sampling,
    std::vector<int32_t> min_tokens_stops, absl::Span<const int32_t> prompt,
    bool forks, std::shared_ptr<const grammar::CompiledGrammar> grammar) {
  owner_.CheckOwner("ModelRunner");
  std::unique_ptr<grammar::GrammarState> state;
  if (grammar != nullptr) {
    KV_ASSIGN_OR_RETURN(state, grammar::GrammarState::Create(std::move(grammar),
                                                             min_tokens_stops));
  }
  requests_.insert_or_assign(
      id, RunnerRequest(sampling, std::move(min_tokens_stops), prompt, forks,
                        std::move(state)));
  return absl::OkStatus();
}

void ModelRunner::RemoveRequest(RequestId id) {
  owner_.CheckOwner("ModelRunner");
  requests_.erase(id);
}

SampleResult ModelRunner::SampleForkedFirst(RequestId id,
                                            std::vector<float> logits) {
  owner_.CheckOwner("ModelRunner");
  RunnerRequest& r = requests_.at(id);
  if (r.grammar != nullptr) r.grammar->MaskLogits(absl::MakeSpan(logits));
  SampleResult res =
      Sample(absl::MakeSpan(logits), r.sampling, r.history, r.sampler);
  Emitted(r, res.token);
  return res;
}

StepResult ModelRunner::Execute(const scheduler::SchedulerOutput& out) {
  owner_.CheckOwner("ModelRunner");
  StepResult result;
  // Swap out, swap in, copy-on-write: before the forward reads the blocks.
  // A failed move (a bug in the plan) fails the step like a failed forward.
  const absl::Status moved = RunBlockMoves(out, &result);
  BuildBatch(out, &result.producers);
  if (fault_step_delay_ > absl::ZeroDuration()) {
    absl::SleepFor(fault_step_delay_);
  }
  result.load = models::LoadOf(batch_);
  const bool overlap = StartMasks(out, result.producers);
  const absl::Time fwd0 = clock_->Now();
  step_out_.kv_groups_rebuilt = 0;
  result.status = moved.ok() ? backend_->Forward(batch_, &step_out_) : moved;
  result.forward_seconds = absl::ToDoubleSeconds(clock_->Now() - fwd0);
  if (overlap) mask_worker_->Wait();
  result.block_mass.swap(step_out_.block_mass);
  result.block_mass_stride = batch_.max_blocks_per_seq;
  result.kv_groups_rebuilt = step_out_.kv_groups_rebuilt;
  if (result.status.ok()) {
    SampleAll(out, &result);
  } else {  // one token each, as UpdateFromOutput needs
    result.tokens.assign(result.producers.size(), 0);
  }
  return result;
}

void ModelRunner::set_overlap_masks(bool on) {
  owner_.CheckOwner("ModelRunner");
  if (!on) {
    mask_worker_.reset();
  } else if (mask_worker_ == nullptr) {
    mask_worker_ = std::make_unique<MaskWorker>();
  }
}

bool ModelRunner::StartMasks(const scheduler::SchedulerOutput& out,
                             const std::vector<int32_t>& producers) {
  if (mask_worker_ == nullptr) return false;
  std::vector<grammar::GrammarState*> states;
  for (const int32_t i : producers) {
    RunnerRequest& r = requests_.at(out.scheduled[i].id);
    if (r.grammar != nullptr && !r.grammar->terminated()) {
      states.push_back(r.grammar.get());
    }
  }
  if (states.empty()) return false;
  mask_worker_->Start(std::move(states));
  return true;
}

absl::Status ModelRunner::RunBlockMoves(const scheduler::SchedulerOutput& out,
                                        StepResult* result) {
  if (!out.blocks_to_swap_out.empty()) {
    KV_RETURN_IF_ERROR(backend_->SwapOut(out.blocks_to_swap_out));
    result->swapped_out_blocks =
        static_cast<int64_t>(out.blocks_to_swap_out.size());
  }
  if (!out.blocks_to_swap_in.empty()) {
    KV_RETURN_IF_ERROR(backend_->SwapIn(out.blocks_to_swap_in));
    result->swapped_in_blocks =
        static_cast<int64_t>(out.blocks_to_swap_in.size());
  }
  if (!out.blocks_to_copy.empty()) {
    KV_RETURN_IF_ERROR(backend_->CopyBlocks(out.blocks_to_copy));
  }
  return absl::OkStatus();
}

void ModelRunner::BuildBatch(const scheduler::SchedulerOutput& out,
                             std::vector<int32_t>* producers) {
  models::ForwardBatch& b = batch_;
  const int32_t bs = block_size_;
  b.token_ids.assign(out.token_ids.begin(), out.token_ids.end());
  for (auto* v : {&b.positions, &b.slot_mapping, &b.seq_starts, &b.context_lens,
                  &b.logits_rows}) {
    v->clear();
  }
  b.argmax_only.clear();
  b.rope_positions.clear();
  b.sink_lens.clear();
  b.mass_seqs.clear();
  bool own_rope = false, any_mass = false;
  b.seq_starts.push_back(0);
  int32_t max_blocks = 1;
  for (const auto& s : out.scheduled)
    max_blocks = std::max(max_blocks, s.num_blocks);
  b.max_blocks_per_seq = max_blocks;
  b.block_tables.resize(out.scheduled.size() * max_blocks);
  for (size_t i = 0; i < out.scheduled.size(); ++i) {
    const auto& s = out.scheduled[i];
    const auto table = out.BlockTable(s);
    std::copy(table.begin(), table.end(),
              b.block_tables.begin() + i * max_blocks);
    // RoPE positions apart from KV indices from the first sequence whose
    // KV policy dropped tokens on (the earlier ones' are their indices).
    if (s.kv_offset > 0 && !own_rope) {
      b.rope_positions.assign(b.positions.begin(), b.positions.end());
      b.sink_lens.assign(i, 0);
      own_rope = true;
    }
    if (own_rope) b.sink_lens.push_back(s.kv_offset > 0 ? s.kv_sink_len : 0);
    if (s.track_mass && !any_mass) {
      b.mass_seqs.assign(i, 0);
      any_mass = true;
    }
    if (any_mass) b.mass_seqs.push_back(s.track_mass ? 1 : 0);
    for (int32_t j = 0; j < s.num_new_tokens; ++j) {
      const int32_t pos = s.start_position + j;
      const int32_t kv = pos - s.kv_offset;  // its KV index
      b.positions.push_back(kv);
      if (own_rope) b.rope_positions.push_back(pos);
      b.slot_mapping.push_back(table[kv / bs] * bs + kv % bs);
    }
    b.seq_starts.push_back(s.token_offset + s.num_new_tokens);
    b.context_lens.push_back(s.start_position + s.num_new_tokens - s.kv_offset);
    if (s.produces_token) {  // its last known token's row, then its drafts'
      const bool argmax = requests_.at(s.id).NeedsOnlyArgmax();
      for (int32_t j = s.num_draft_tokens; j >= 0; --j) {
        b.logits_rows.push_back(s.token_offset + s.num_new_tokens - 1 - j);
        b.argmax_only.push_back(argmax);
      }
      producers->push_back(static_cast<int32_t>(i));
    }
  }
}

void ModelRunner::SampleAll(const scheduler::SchedulerOutput& out,
                            StepResult* result) {
  const std::vector<int32_t>& producers = result->producers;
  result->counts.resize(producers.size());
  int64_t row = 0;  // logits row of the producer's first sample
  for (size_t k = 0; k < producers.size(); ++k) {
    const auto& s = out.scheduled[producers[k]];
    RunnerRequest& r = requests_.at(s.id);
    const auto drafts = out.TokenIds(s).last(s.num_draft_tokens);
    // Each row is sampled as a step without speculation would sample it
    // (the same draw, history and penalties); a draft token is accepted
    // while it is what was sampled. For drafts that are single tokens this
    // is the rejection rule: the outputs, and their distribution, are those
    // of decoding without a draft.
    int32_t n = 0;
    for (int32_t j = 0; j <= s.num_draft_tokens; ++j) {
      SampleResult res = SampleRow(s.id, r, row + j, result);
      const int32_t token = res.token;
      result->sampled.push_back(std::move(res));
      result->tokens.push_back(token);
      ++n;
      if (j == s.num_draft_tokens || token != drafts[j]) break;
    }
    r.forks_pending = false;
    result->counts[k] = n;
    result->draft_tokens += s.num_draft_tokens;
    result->accepted_tokens += n - 1;
    row += s.num_draft_tokens + 1;
  }
}

SampleResult ModelRunner::SampleRow(RequestId id, RunnerRequest& r, int64_t row,
                                    StepResult* result) {
  SampleResult res;
  if (!step_out_.argmax.empty() && r.NeedsOnlyArgmax()) {
    // The backend reduced the row on the device (and may not have copied
    // it): the same token Sample would pick from it.
    res = SampleFromArgmax(step_out_.argmax[row], r.sampler);
  } else {
    absl::Span<float> logits(step_out_.logits.data() + row * vocab_size_,
                             vocab_size_);
    if (r.forks_pending) {  // raw: each child masks its own copy
      result->fork_logits[id].assign(logits.begin(), logits.end());
    }
    if (r.grammar != nullptr) {
      const absl::Time t0 = clock_->Now();
      r.grammar->MaskLogits(logits);
      result->grammar_seconds += absl::ToDoubleSeconds(clock_->Now() - t0);
      ++result->grammar_masks;
    }
    res = Sample(logits, r.sampling, r.history, r.sampler);
  }
  Emitted(r, res.token);
  return res;
}

void ModelRunner::Emitted(RunnerRequest& r, int32_t token) {
  r.Sampled(token);
  // The mask allowed `token`, so the grammar takes it; a refusal means the
  // row had no allowed token left (a terminated grammar), and the request
  // ends on the stop token the engine sees anyway.
  if (r.grammar != nullptr && !r.grammar->terminated()) {
    (void)r.grammar->Accept(token);
  }
}

}  // namespace kvserve::engine
