// Test support: drives one sequence through a CpuLlamaModel over a
// KvCacheStorage: chunked prefill, then one decode token per step. Blocks are
// taken in order from the storage (no sharing, no preemption), so the parity
// tests see the model and the KV storage alone; the serving engine uses the
// scheduler and KV manager instead.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "engine/runner/kv_cache_storage.h"
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

inline SequenceRunner::SequenceRunner(models::CpuLlamaModel* model,
                                      KvCacheStorage* storage,
                                      int32_t prefill_chunk)
    : model_(model),
      storage_(storage),
      prefill_chunk_(std::max(1, prefill_chunk)),
      block_table_(storage->num_blocks()) {
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

inline absl::StatusOr<absl::Span<const float>> SequenceRunner::Append(
    absl::Span<const int32_t> tokens) {
  if (tokens.empty()) {
    return absl::InvalidArgumentError("SequenceRunner::Append: no tokens");
  }
  if (length_ + static_cast<int64_t>(tokens.size()) > capacity()) {
    return absl::OutOfRangeError(absl::StrFormat(
        "sequence of %d tokens exceeds the KV cache capacity of %d tokens",
        length_ + tokens.size(), capacity()));
  }
  const int32_t bs = storage_->block_size();
  for (size_t off = 0; off < tokens.size(); off += prefill_chunk_) {
    const int32_t n = static_cast<int32_t>(
        std::min<size_t>(prefill_chunk_, tokens.size() - off));
    batch_.token_ids.assign(tokens.begin() + off, tokens.begin() + off + n);
    batch_.positions.resize(n);
    batch_.slot_mapping.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t pos = length_ + i;
      batch_.positions[i] = pos;
      batch_.slot_mapping[i] = block_table_[pos / bs] * bs + pos % bs;
    }
    const int32_t new_len = length_ + n;
    batch_.seq_starts = {0, n};
    batch_.context_lens = {new_len};
    batch_.max_blocks_per_seq = (new_len + bs - 1) / bs;
    batch_.block_tables.assign(
        block_table_.begin(), block_table_.begin() + batch_.max_blocks_per_seq);
    batch_.logits_rows = {n - 1};
    KV_RETURN_IF_ERROR(model_->Forward(batch_, storage_->view(), &logits_));
    length_ = new_len;
  }
  return absl::Span<const float>(logits_);
}

}  // namespace kvserve::engine
