#include "models/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/parallel.h"
#include "models/cpu/ops.h"

namespace kvserve::models {
namespace {

struct TokenRef {
  int32_t seq;
  int32_t pos;
};

// Attention of one token for the query heads of one KV head group.
void AttendGroup(const AttentionParams& p, const ForwardBatch& batch,
                 TokenRef tok, int kv_head, const float* q_row,
                 const float* k_cache, const float* v_cache, int32_t block_size,
                 float* out_row, std::vector<float>& scores) {
  const int group = p.num_heads / p.num_kv_heads;
  const int d = p.head_dim;
  const int64_t slot_stride = static_cast<int64_t>(p.num_kv_heads) * d;
  const int32_t* table =
      batch.block_tables.data() +
      static_cast<int64_t>(tok.seq) * batch.max_blocks_per_seq;
  const int32_t begin =
      p.sliding_window > 0 ? std::max(0, tok.pos - p.sliding_window + 1) : 0;
  const int32_t end = tok.pos + 1;  // causal: keys [begin, pos]
  const int32_t n = end - begin;
  scores.resize(static_cast<size_t>(group) * n);

  // Pass 1: scores[g][t] = scale * q_g . k_t (each K row read once).
  for (int32_t t = begin; t < end; ++t) {
    const int64_t slot =
        static_cast<int64_t>(table[t / block_size]) * block_size +
        t % block_size;
    const float* k = k_cache + slot * slot_stride + kv_head * d;
    for (int g = 0; g < group; ++g) {
      const float* qg = q_row + (kv_head * group + g) * d;
      scores[g * n + (t - begin)] = p.scale * cpu::Dot(qg, k, d);
    }
  }
  for (int g = 0; g < group; ++g) cpu::Softmax(scores.data() + g * n, n);

  // Pass 2: out_g = sum_t softmax_g[t] * v_t.
  for (int g = 0; g < group; ++g) {
    std::fill_n(out_row + (kv_head * group + g) * d, d, 0.0f);
  }
  for (int32_t t = begin; t < end; ++t) {
    const int64_t slot =
        static_cast<int64_t>(table[t / block_size]) * block_size +
        t % block_size;
    const float* v = v_cache + slot * slot_stride + kv_head * d;
    for (int g = 0; g < group; ++g) {
      cpu::Axpy(scores[g * n + (t - begin)], v,
                out_row + (kv_head * group + g) * d, d);
    }
  }
}

}  // namespace

void PagedAttention(const AttentionParams& p, const ForwardBatch& batch,
                    const float* q, int64_t q_stride, const float* k_cache,
                    const float* v_cache, int32_t block_size, float* out) {
  const int32_t num_tokens = batch.num_tokens();
  std::vector<TokenRef> refs(num_tokens);
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    for (int32_t i = batch.seq_starts[s]; i < batch.seq_starts[s + 1]; ++i) {
      refs[i] = {s, batch.positions[i]};
    }
  }
  const int64_t out_stride = static_cast<int64_t>(p.num_heads) * p.head_dim;
  const int64_t items = static_cast<int64_t>(num_tokens) * p.num_kv_heads;
  // Later tokens of a causal prefill cost more: hand out items dynamically,
  // longest first.
  ParallelForEach(items, [&](int64_t rev) {
    thread_local std::vector<float> scores;
    const int64_t it = items - 1 - rev;
    const int64_t i = it / p.num_kv_heads;
    const int kv_head = static_cast<int>(it % p.num_kv_heads);
    AttendGroup(p, batch, refs[i], kv_head, q + i * q_stride, k_cache, v_cache,
                block_size, out + i * out_stride, scores);
  });
}

}  // namespace kvserve::models
