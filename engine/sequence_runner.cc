#include "engine/sequence_runner.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace kvserve::engine {

SequenceRunner::SequenceRunner(models::CpuLlamaModel* model,
                               KvCacheStorage* storage, int32_t prefill_chunk)
    : model_(model),
      storage_(storage),
      prefill_chunk_(std::max(1, prefill_chunk)),
      block_table_(storage->num_blocks()) {
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

absl::StatusOr<absl::Span<const float>> SequenceRunner::Append(
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
