// The input of one forward step: a flattened batch of tokens from many
// sequences (prefill chunks and decode tokens mixed), with explicit paged
// attention metadata. Built by the engine's ModelRunner::BuildBatch (and
// the parity tests' SequenceRunner); no global state.
//
// Token t of a sequence lives in KV block `block_table[t / B]`, slot `t % B`
// (B = block size). The new tokens of sequence s occupy KV positions
// [context_lens[s] - n_s, context_lens[s]) where n_s is its token count in
// this batch, and attend causally to every earlier position of the sequence.
//
//   tokens:  | s0: p0 p1 p2 p3 | s1: d | s2: d | s3: p0 p1 |
//   seq_starts = {0, 4, 5, 6, 8}
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvserve::models {

struct ForwardBatch {
  std::vector<int32_t> token_ids;  // [T]
  std::vector<int32_t> positions;  // [T] KV index (and RoPE position)
  // Empty, or [T]: RoPE positions where they differ from the KV index (a
  // sequence whose bounded KV policy dropped blocks keeps the positions its
  // tokens had; attention still walks KV indices). RopePositions() reads it.
  std::vector<int32_t> rope_positions;
  // Empty, or [S]: sequence s's keys at KV indices [0, sink_lens[s]) (the
  // blocks a bounded KV policy keeps from the start, never moved) are
  // scored with the query rotated at its KV index instead of its RoPE
  // position. Every query-key distance is then the distance within the
  // cache, as if the dropped tokens had never been there (StreamingLLM):
  // the kept keys after the sinks moved by the dropped count, and so does
  // the query. 0 for a sequence that dropped nothing.
  std::vector<int32_t> sink_lens;
  // Empty, or [S]: 1 where the caller wants the sequence's attention mass
  // per KV block (ForwardOutput::block_mass; a heavy-hitters KV policy).
  std::vector<uint8_t> mass_seqs;
  std::vector<int32_t> slot_mapping;  // [T] block * B + offset to write K/V
  std::vector<int32_t> seq_starts;    // [S + 1] token offsets per sequence
  std::vector<int32_t> context_lens;  // [S] KV length after this step
  // [S * max_blocks_per_seq] row-major; unused tail entries are ignored.
  std::vector<int32_t> block_tables;
  int32_t max_blocks_per_seq = 0;
  // Token rows whose logits the caller wants (e.g. the last of each
  // sequence that finishes its prompt or decodes).
  std::vector<int32_t> logits_rows;
  // Empty, or one flag per logits row: 1 when the caller needs only that
  // row's argmax (greedy decoding without penalties or logprobs). A backend
  // that reduces rows on the device then skips copying them to the host;
  // others ignore it.
  std::vector<uint8_t> argmax_only;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  const int32_t* RopePositions() const {
    return rope_positions.empty() ? positions.data() : rope_positions.data();
  }
  int32_t SinkLen(int32_t seq) const {
    return sink_lens.empty() ? 0 : sink_lens[seq];
  }
  bool WantsMass(int32_t seq) const {
    return !mass_seqs.empty() && mass_seqs[seq] != 0;
  }
  int32_t num_seqs() const {
    return seq_starts.empty() ? 0 : static_cast<int32_t>(seq_starts.size()) - 1;
  }
  // Consistency of sizes, positions, and block references against a pool of
  // `num_blocks` blocks of `block_size`; names the first offending field.
  [[nodiscard]] absl::Status Validate(int32_t num_blocks, int32_t block_size,
                                      int32_t vocab_size) const;
};

// What a batch asks of a forward, in counts: its query tokens (prefill and
// decode together), the keys they attend to in total, the cached tokens
// whose K/V it reads, and its sequences. The step summary a step profile or
// a roofline (models/sim) reads; no device involved.
struct BatchLoad {
  int64_t tokens = 0;
  int64_t attended = 0;
  int64_t kv_read_tokens = 0;
  int64_t seqs = 0;  // sequences in the step (prefill chunks and decodes)
};

// Sequence s with n new tokens and context c attends n*c - n(n-1)/2 keys
// and reads the K/V of its c - n cached tokens.
[[nodiscard]] BatchLoad LoadOf(const ForwardBatch& batch);

// What one step returns to the host.
struct ForwardOutput {
  // [logits_rows.size(), vocab] row-major fp32, in host memory the backend
  // owns (pinned on a GPU, so the copy runs at bus speed), valid until its
  // next Forward. Rows flagged argmax_only may be left unwritten by a
  // backend that filled `argmax`.
  absl::Span<float> logits;
  // Empty, or [logits_rows.size()]: each row's argmax (the lowest index on
  // ties, as std::max_element), computed on the device for every row.
  std::vector<int32_t> argmax;
  // Empty unless the batch has mass_seqs: [S * max_blocks_per_seq], entry
  // (s, b) the softmax weight sequence s's query rows of this step gave the
  // keys of its table entry b, summed over rows, query heads and layers
  // (0 for a sequence that did not ask). A backend without it leaves it
  // empty.
  std::vector<float> block_mass;
  // int3/int2 key groups whose exact rows were gone and were rebuilt from
  // their codes in this forward (lossy; models/cpu/kv_residual.h).
  int64_t kv_groups_rebuilt = 0;
};

}  // namespace kvserve::models
