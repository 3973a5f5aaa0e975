// ModelRunner: the device half of one engine step. It owns the ModelBackend
// (weights, KV bytes, swap space) and, given the scheduler's plan of a step,
// performs its block moves, builds the ForwardBatch, runs the forward and
// samples the next token of every request that produces one. It owns what
// sampling needs of each request (RunnerRequest: parameters, random stream,
// penalty context, fork flag), kept from AddRequest to RemoveRequest, and
// reads nothing but the scheduler's output: no block bookkeeping, no output
// text. It reports what it sampled in a StepResult; the engine feeds that
// back to the scheduler and emits it.
//
// Order within Execute, as scheduler.h and model_backend.h state it: swap
// out, swap in, copy-on-write copies (each list in its order), then the
// forward. A failed move fails the step like a failed forward: nothing is
// sampled and the status says why.
//
// Thread safety: none. Owned by Engine::Impl; engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/thread_owner.h"
#include "engine/runner/mask_worker.h"
#include "engine/runner/model_backend.h"
#include "engine/runner/runner_request.h"
#include "engine/runner/sampler.h"
#include "grammar/grammar_compiler.h"
#include "models/forward_batch.h"
#include "scheduler/scheduler.h"

namespace kvserve::engine {

using RequestId = scheduler::RequestId;

// What one step computed.
struct StepResult {
  // OK, or the error of the first failed block move or of the forward; then
  // `sampled` is empty and `tokens` holds zeros.
  absl::Status status;
  // Indices into SchedulerOutput::scheduled of the requests that produce
  // tokens, in order; counts[k] is how many producer k sampled (1, or up to
  // 1 + its draft tokens), and `sampled` and `tokens` hold them all, producer
  // after producer.
  std::vector<int32_t> producers;
  std::vector<int32_t> counts;
  std::vector<SampleResult> sampled;
  // The sampled token ids, the form Scheduler::UpdateFromOutput takes.
  std::vector<int32_t> tokens;
  // Structured output: the rows masked by a grammar, and the time masking
  // and advancing grammars took.
  int32_t grammar_masks = 0;
  double grammar_seconds = 0;
  // Speculative decoding: draft tokens scored in this step, and accepted.
  int32_t draft_tokens = 0;
  int32_t accepted_tokens = 0;
  // Raw prompt logits of the n > 1 parents that fork in this step, by id.
  absl::flat_hash_map<RequestId, std::vector<float>> fork_logits;
  // Blocks moved to and from swap slots by this step.
  int64_t swapped_out_blocks = 0;
  int64_t swapped_in_blocks = 0;
  // Wall time of the forward alone.
  double forward_seconds = 0;
  // ForwardOutput::block_mass of the step (heavy-hitters requests), with
  // block_mass_stride entries per scheduled request.
  std::vector<float> block_mass;
  int32_t block_mass_stride = 0;
  // ForwardOutput::kv_groups_rebuilt of the step.
  int64_t kv_groups_rebuilt = 0;
  // What the forward did (tokens, sequences, keys attended, K/V read).
  models::BatchLoad load;
};

class ModelRunner {
 public:
  // `block_size` is the scheduler's; `vocab_size` the model's. A positive
  // `fault_step_delay` sleeps that long before every forward (fault
  // injection for tests: a stalled device).
  // `clock` times the forward (must outlive the runner).
  ModelRunner(std::unique_ptr<ModelBackend> backend, int32_t block_size,
              int32_t vocab_size, absl::Duration fault_step_delay,
              const Clock* clock = &SystemClock::Get());

  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Starts keeping `id`'s sampling state (RunnerRequest's arguments). With
  // `grammar`, its outputs follow it from the grammar's start, ended by
  // `min_tokens_stops` (the request's stop tokens) once it is complete;
  // INVALID_ARGUMENT if that state cannot be made (nothing is kept).
  [[nodiscard]] absl::Status AddRequest(
      RequestId id, const SamplingParams& sampling,
      std::vector<int32_t> min_tokens_stops, absl::Span<const int32_t> prompt,
      bool forks,
      std::shared_ptr<const grammar::CompiledGrammar> grammar = nullptr);
  // Forgets `id` (ended); no-op for an id it does not keep.
  void RemoveRequest(RequestId id);
  // The first token of a forked child `id` (added, not yet scheduled), from
  // a copy of its parent's raw prompt logits.
  [[nodiscard]] SampleResult SampleForkedFirst(RequestId id,
                                               std::vector<float> logits);

  // Runs the step `out` plans; every request it schedules must have been
  // added. Consumes the requests' random streams as it samples.
  [[nodiscard]] StepResult Execute(const scheduler::SchedulerOutput& out);

  [[nodiscard]] const ModelBackend& backend() const { return *backend_; }

  // On: constrained sequences' next-token masks are computed on a thread of
  // their own while the forward runs (engine/runner/mask_worker.h); off:
  // on the engine thread as each row is sampled.
  void set_overlap_masks(bool on);

  // Makes the calling thread the one Execute checks for (debug builds); the
  // engine calls it first thing on its thread.
  void BindOwnerThread() { owner_.Rebind(); }

  // Performs `out`'s block moves on the backend in the scheduler's order:
  // swap out, swap in, copy-on-write copies. Execute runs it; a step that
  // schedules nothing but preempts by swap needs it alone.
  [[nodiscard]] absl::Status RunBlockMoves(
      const scheduler::SchedulerOutput& out, StepResult* result);

 private:
  // Fills batch_ for `out`, reusing its buffers: a row's block-table tail
  // past its blocks keeps whatever an earlier step left (block ids of this
  // pool; readers ignore it), so no step clears tables of S x max blocks.
  void BuildBatch(const scheduler::SchedulerOutput& out,
                  std::vector<int32_t>* producers);
  void SampleAll(const scheduler::SchedulerOutput& out, StepResult* result);
  // With the mask worker: starts it on the constrained producers' next
  // masks; true if it runs (Execute waits for it after the forward).
  bool StartMasks(const scheduler::SchedulerOutput& out,
                  const std::vector<int32_t>& producers);
  // Samples logits row `row` of the step for request `id` (`r`).
  SampleResult SampleRow(RequestId id, RunnerRequest& r, int64_t row,
                         StepResult* result);
  // Records `token` as emitted by `r`: the penalty context, its grammar.
  static void Emitted(RunnerRequest& r, int32_t token);

  std::unique_ptr<ModelBackend> backend_;
  const int32_t block_size_;
  const int32_t vocab_size_;
  const absl::Duration fault_step_delay_;
  const Clock* clock_;
  absl::flat_hash_map<RequestId, RunnerRequest> requests_;
  models::ForwardBatch batch_;      // the step's batch, buffers reused
  models::ForwardOutput step_out_;  // the last forward's logits / argmax
  std::unique_ptr<MaskWorker> mask_worker_;  // set_overlap_masks(true)
  ThreadOwner owner_;                        // the engine thread
};

}  // namespace kvserve::engine
