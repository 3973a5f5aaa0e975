// Drives one sequence through a CpuLlamaModel over a KvCacheStorage: chunked
// prefill, then one decode token per step. Blocks are taken in order from
// the storage (no sharing, no preemption): this is the one-shot path of
// `kvserve generate` and the parity tests. The serving
// engine uses the scheduler and KV manager instead.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv_cache_storage.h"
#include "models/cpu/cpu_llama_model.h"

namespace kvserve::engine {

class SequenceRunner {
 public:
  // `prefill_chunk`: most prompt tokens per forward call.
  SequenceRunner(models::CpuLlamaModel* model, KvCacheStorage* storage,
                 int32_t prefill_chunk = 512);

  // Appends `tokens` to the sequence and returns the logits after the last
  // one ([vocab]). OutOfRange when the KV storage cannot hold them.
  [[nodiscard]] absl::StatusOr<absl::Span<const float>> Append(
      absl::Span<const int32_t> tokens);

  // Forgets the sequence (its blocks become reusable).
  void Reset() { length_ = 0; }
  int32_t length() const { return length_; }
  int32_t capacity() const {
    return storage_->num_blocks() * storage_->block_size();
  }

 private:
  models::CpuLlamaModel* model_;
  KvCacheStorage* storage_;
  int32_t prefill_chunk_;
  int32_t length_ = 0;
  std::vector<int32_t> block_table_;
  models::ForwardBatch batch_;
  std::vector<float> logits_;
};

}  // namespace kvserve::engine
