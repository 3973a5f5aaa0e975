#include "models/forward_batch.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace kvserve::models {
namespace {

// The largest of p[0, n) read as unsigned (a negative id reads as huge), in
// eight independent lanes that the compiler turns into one vector max: a
// step validates every block of every sequence.
uint32_t MaxAsUnsigned(const int32_t* p, int32_t n) {
  uint32_t m[8] = {};
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      m[j] = std::max(m[j], static_cast<uint32_t>(p[i + j]));
    }
  }
  for (; i < n; ++i) m[0] = std::max(m[0], static_cast<uint32_t>(p[i]));
  return *std::max_element(m, m + 8);
}

}  // namespace

BatchLoad LoadOf(const ForwardBatch& batch) {
  BatchLoad load;
  load.tokens = batch.num_tokens();
  load.seqs = batch.num_seqs();
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int64_t n = batch.seq_starts[s + 1] - batch.seq_starts[s];
    const int64_t ctx = batch.context_lens[s];
    load.attended += n * ctx - n * (n - 1) / 2;
    load.kv_read_tokens += ctx - n;
  }
  return load;
}

absl::Status ForwardBatch::Validate(int32_t num_blocks, int32_t block_size,
                                    int32_t vocab_size) const {
  const int32_t t = num_tokens();
  const int32_t s = num_seqs();
  // Untyped: clang requires a constexpr format for absl::StrFormat.
  auto bad = [](absl::string_view format, const auto&... args) {
    std::string message;
    (void)absl::FormatUntyped(&message, absl::UntypedFormatSpec(format),
                              {absl::FormatArg(args)...});
    return absl::InvalidArgumentError(message);
  };
  if (!rope_positions.empty() && rope_positions.size() != t) {
    return bad("forward batch: rope_positions has %d entries for %d tokens",
               rope_positions.size(), t);
  }
  if (positions.size() != t || slot_mapping.size() != t) {
    return bad(
        "forward batch: positions (%d) and slot_mapping (%d) must "
        "have one entry per token (%d)",
        positions.size(), slot_mapping.size(), t);
  }
  if (s <= 0 || seq_starts.front() != 0 || seq_starts.back() != t ||
      context_lens.size() != s) {
    return bad(
        "forward batch: seq_starts must run from 0 to %d with one "
        "context_len per sequence",
        t);
  }
  if (max_blocks_per_seq <= 0 || block_tables.size() < s * max_blocks_per_seq) {
    return bad("forward batch: block_tables has %d entries, need %d x %d",
               block_tables.size(), s, max_blocks_per_seq);
  }
  if (!mass_seqs.empty() && mass_seqs.size() != s) {
    return bad("forward batch: mass_seqs has %d entries for %d sequences",
               mass_seqs.size(), s);
  }
  if (!sink_lens.empty() && sink_lens.size() != s) {
    return bad("forward batch: sink_lens has %d entries for %d sequences",
               sink_lens.size(), s);
  }
  for (int32_t q = 0; q < s; ++q) {
    const int32_t n = seq_starts[q + 1] - seq_starts[q];
    if (n <= 0 || context_lens[q] < n ||
        context_lens[q] > max_blocks_per_seq * block_size) {
      return bad(
          "forward batch: sequence %d has %d new tokens and "
          "context_len %d (capacity %d)",
          q, n, context_lens[q], max_blocks_per_seq * block_size);
    }
    if (SinkLen(q) < 0 || SinkLen(q) > context_lens[q]) {
      return bad("forward batch: sequence %d has sink_len %d, context_len %d",
                 q, SinkLen(q), context_lens[q]);
    }
    const int32_t nblocks = (context_lens[q] + block_size - 1) / block_size;
    const auto row = block_tables.begin() + q * max_blocks_per_seq;
    if (MaxAsUnsigned(&*row, nblocks) >= static_cast<uint32_t>(num_blocks)) {
      const auto bad_it = std::find_if(row, row + nblocks, [&](int32_t id) {
        return id < 0 || id >= num_blocks;
      });
      return bad(
          "forward batch: sequence %d block_tables[%d] = %d outside "
          "[0, %d)",
          q, bad_it - row, *bad_it, num_blocks);
    }
    for (int32_t i = seq_starts[q]; i < seq_starts[q + 1]; ++i) {
      const int32_t pos = context_lens[q] - n + (i - seq_starts[q]);
      if (positions[i] != pos) {
        return bad("forward batch: token %d position %d, expected %d", i,
                   positions[i], pos);
      }
      const int32_t want =
          block_tables[q * max_blocks_per_seq + pos / block_size] * block_size +
          pos % block_size;
      if (slot_mapping[i] != want) {
        return bad("forward batch: token %d slot %d, block table says %d", i,
                   slot_mapping[i], want);
      }
      if (token_ids[i] < 0 || token_ids[i] >= vocab_size) {
        return bad("forward batch: token id %d outside [0, %d)", token_ids[i],
                   vocab_size);
      }
    }
  }
  if (!argmax_only.empty() && argmax_only.size() != logits_rows.size()) {
    return bad("forward batch: argmax_only has %d flags for %d logits rows",
               argmax_only.size(), logits_rows.size());
  }
  for (int32_t r : logits_rows) {
    if (r < 0 || r >= t) return bad("forward batch: logits row %d of %d", r, t);
  }
  return absl::OkStatus();
}

}  // namespace kvserve::models
