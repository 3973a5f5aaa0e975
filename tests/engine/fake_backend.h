// A scripted ModelBackend for engine tests, and a model without weights to
// run it with. Test-only.
//
// The "model": a sequence whose KV holds t_0 .. t_{n-1} predicts
// NextToken(t_0, t_{n-1}) = (t_0 + t_{n-1}) % vocab, t_0 read back from the
// KV store. Its logits row peaks on that token with a falling tail on the
// two after it, so greedy decoding follows the rule and seeded sampling has
// a real choice. Prompt {2, 3} greedily continues 5, 7, 9, ...
//
// The KV store holds one record per slot: the token written there, its
// position, and the sequence's token before it as the KV held it at the
// write. After writing a batch, Forward checks every position of every
// sequence in it through its block table: each slot must hold its own
// position and continue the record before it. A block not swapped in, not
// copied on write, or reused while still in use breaks that chain: Forward
// then fails with an Internal error naming the slot (kv_errors() lists
// them). Swap slots hold whole blocks of records; SwapIn empties the slot
// it reads (the scheduler frees it then).
//
// Actions (At) run on the engine thread at the start of a given Forward,
// outside the backend's lock: they may fail the step (their error is
// Forward's, before any KV is written), delay it, or submit and abort
// requests (the engine takes those at its next step). Every step's batch and
// the block moves that preceded it are recorded (steps()).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/model_backend.h"
#include "models/forward_batch.h"
#include "models/model_config.h"
#include "models/tokenizer/tokenizer.h"
#include "models/tokenizer/tokenizer_data.h"

namespace kvserve::engine::test {

// What one Forward received: its batch and the block moves since the
// previous Forward.
struct StepRecord {
  int64_t step = 0;
  models::ForwardBatch batch;
  std::vector<BlockMove> swap_out, swap_in, copies;
};

class FakeBackend final : public ModelBackend {
 public:
  struct Options {
    int32_t num_blocks = 16;
    int32_t block_size = 4;
    int32_t num_swap_slots = 0;
    int32_t vocab = 64;
  };
  using Action = std::function<absl::Status(const StepRecord&)>;

  explicit FakeBackend(const Options& o)
      : o_(o),
        kv_(static_cast<size_t>(o.num_blocks) * o.block_size),
        swap_(static_cast<size_t>(o.num_swap_slots) * o.block_size) {}

  static int32_t NextToken(int32_t first, int32_t last, int32_t vocab) {
    return (first + last) % vocab;
  }

  // Runs `action` at the start of forward `step` (0-based). Call before the
  // engine takes requests, or from another action.
  void At(int64_t step, Action action) {
    absl::MutexLock lock(&mu_);
    actions_[step] = std::move(action);
  }
  // The forward running or last run (-1 before the first).
  int64_t step() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int64_t>(steps_.size()) - 1;
  }
  std::vector<StepRecord> steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  std::vector<std::string> kv_errors() const {
    absl::MutexLock lock(&mu_);
    return kv_errors_;
  }

  std::string_view device_name() const override { return "fake"; }
  kvcache::KvDtype kv_dtype() const override { return kvcache::KvDtype::kF32; }
  int32_t num_blocks() const override { return o_.num_blocks; }
  int32_t block_size() const override { return o_.block_size; }
  int64_t bytes_per_block() const override { return 1024; }
  int32_t num_swap_slots() const override { return o_.num_swap_slots; }
  double seconds_per_prefill_token() const override { return 1e-4; }
  double swap_bytes_per_second() const override { return 1e9; }

  absl::Status Forward(const models::ForwardBatch& batch,
                       models::ForwardOutput* out) override {
    StepRecord record;
    Action action;
    {
      absl::MutexLock lock(&mu_);
      record.step = static_cast<int64_t>(steps_.size());
      record.batch = batch;
      record.swap_out = std::exchange(pending_.swap_out, {});
      record.swap_in = std::exchange(pending_.swap_in, {});
      record.copies = std::exchange(pending_.copies, {});
      steps_.push_back(record);
      if (auto it = actions_.find(record.step); it != actions_.end()) {
        action = it->second;
      }
    }
    if (action) KV_RETURN_IF_ERROR(action(record));
    KV_RETURN_IF_ERROR(batch.Validate(o_.num_blocks, o_.block_size, o_.vocab));
    absl::MutexLock lock(&mu_);
    Write(batch);
    KV_RETURN_IF_ERROR(Check(record.step, batch));
    FillLogits(batch, out);
    return absl::OkStatus();
  }

  absl::Status CopyBlocks(absl::Span<const BlockMove> moves) override {
    absl::MutexLock lock(&mu_);
    for (const BlockMove& m : moves) {
      KV_RETURN_IF_ERROR(InRange("CopyBlocks src", m.src, o_.num_blocks));
      KV_RETURN_IF_ERROR(InRange("CopyBlocks dst", m.dst, o_.num_blocks));
      std::copy_n(Block(kv_, m.src), o_.block_size, Block(kv_, m.dst));
      pending_.copies.push_back(m);
    }
    return absl::OkStatus();
  }
  absl::Status SwapOut(absl::Span<const BlockMove> moves) override {
    absl::MutexLock lock(&mu_);
    for (const BlockMove& m : moves) {
      KV_RETURN_IF_ERROR(InRange("SwapOut src", m.src, o_.num_blocks));
      KV_RETURN_IF_ERROR(InRange("SwapOut dst", m.dst, o_.num_swap_slots));
      std::copy_n(Block(kv_, m.src), o_.block_size, Block(swap_, m.dst));
      pending_.swap_out.push_back(m);
    }
    return absl::OkStatus();
  }
  absl::Status SwapIn(absl::Span<const BlockMove> moves) override {
    absl::MutexLock lock(&mu_);
    for (const BlockMove& m : moves) {
      KV_RETURN_IF_ERROR(InRange("SwapIn src", m.src, o_.num_swap_slots));
      KV_RETURN_IF_ERROR(InRange("SwapIn dst", m.dst, o_.num_blocks));
      std::copy_n(Block(swap_, m.src), o_.block_size, Block(kv_, m.dst));
      std::fill_n(Block(swap_, m.src), o_.block_size, Record{});
      pending_.swap_in.push_back(m);
    }
    return absl::OkStatus();
  }

 private:
  // An empty slot has position -1.
  struct Record {
    int32_t token = -1, position = -1, prev = -1;
  };
  struct Moves {
    std::vector<BlockMove> swap_out, swap_in, copies;
  };

  Record* Block(std::vector<Record>& store, int32_t id) {
    return store.data() + static_cast<size_t>(id) * o_.block_size;
  }
  static absl::Status InRange(const char* what, int32_t id, int32_t limit) {
    if (id >= 0 && id < limit) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrFormat(
        "fake backend: %s %d outside [0, %d)", what, id, limit));
  }
  // Sequence `q`'s record at `pos`, through its block table.
  Record& At(const models::ForwardBatch& b, int32_t q, int32_t pos)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int32_t block =
        b.block_tables[q * b.max_blocks_per_seq + pos / o_.block_size];
    return Block(kv_, block)[pos % o_.block_size];
  }

  void Write(const models::ForwardBatch& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int32_t q = 0; q < b.num_seqs(); ++q) {
      for (int32_t i = b.seq_starts[q]; i < b.seq_starts[q + 1]; ++i) {
        const int32_t pos = b.positions[i];  // its KV index
        const int32_t prev = pos == 0              ? -1
                             : i > b.seq_starts[q] ? b.token_ids[i - 1]
                                                   : At(b, q, pos - 1).token;
        // The record keeps its RoPE position: past a KV policy's drop it
        // is the KV index + the tokens dropped.
        kv_[b.slot_mapping[i]] = {b.token_ids[i], b.RopePositions()[i], prev};
      }
    }
  }

  absl::Status Check(int64_t step, const models::ForwardBatch& b)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (int32_t q = 0; q < b.num_seqs(); ++q) {
      // A KV policy's drop (kv_policy streaming): KV index k holds position
      // k up to the gap, k + dropped after it, and `dropped` is what the
      // new tokens' RoPE positions say.
      const int32_t last = b.seq_starts[q + 1] - 1;
      const int32_t dropped = b.RopePositions()[last] - b.positions[last];
      bool past_gap = false;
      int32_t gap_at = 0;  // KV indices before the gap: the sinks' blocks
      for (int32_t pos = 0; pos < b.context_lens[q]; ++pos) {
        const Record& r = At(b, q, pos);
        past_gap = past_gap || r.position != pos;
        if (!past_gap) gap_at = pos + 1;
        const int32_t want = past_gap ? pos + dropped : pos;
        const Record* before = pos == 0 ? nullptr : &At(b, q, pos - 1);
        // Across the gap the token before it is gone: nothing to chain.
        const int32_t want_prev = want == 0                      ? -1
                                  : before->position == want - 1 ? before->token
                                                                 : r.prev;
        if (r.position == want && r.prev == want_prev) continue;
        kv_errors_.push_back(absl::StrFormat(
            "step %d sequence %d position %d (block %d) holds {token %d, "
            "position %d, after %d}, want position %d after %d",
            step, q, pos,
            b.block_tables[q * b.max_blocks_per_seq + pos / o_.block_size],
            r.token, r.position, r.prev, want, want_prev));
        return absl::InternalError("fake backend KV: " + kv_errors_.back());
      }
      // The sinks the attention scores at their in-cache distance: the
      // keys before the gap, once there is one.
      if (b.SinkLen(q) != (dropped > 0 ? gap_at : 0)) {
        kv_errors_.push_back(absl::StrFormat(
            "step %d sequence %d: sink_len %d, want %d (dropped %d)", step, q,
            b.SinkLen(q), dropped > 0 ? gap_at : 0, dropped));
        return absl::InternalError("fake backend KV: " + kv_errors_.back());
      }
    }
    return absl::OkStatus();
  }

  void FillLogits(const models::ForwardBatch& b, models::ForwardOutput* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int32_t v = o_.vocab;
    logits_.assign(b.logits_rows.size() * v, 0.0f);
    for (size_t k = 0; k < b.logits_rows.size(); ++k) {
      const int32_t row = b.logits_rows[k];
      const int32_t q = static_cast<int32_t>(
          std::upper_bound(b.seq_starts.begin(), b.seq_starts.end(), row) -
          b.seq_starts.begin() - 1);
      const int32_t next = NextToken(At(b, q, 0).token, b.token_ids[row], v);
      float* logits = logits_.data() + k * v;
      logits[next] = 6.0f;
      logits[(next + 1) % v] = 5.0f;
      logits[(next + 2) % v] = 4.0f;
    }
    out->logits = absl::MakeSpan(logits_);
    out->argmax.clear();
  }

  const Options o_;
  mutable absl::Mutex mu_;
  std::vector<Record> kv_ ABSL_GUARDED_BY(mu_);
  std::vector<Record> swap_ ABSL_GUARDED_BY(mu_);
  std::vector<float> logits_ ABSL_GUARDED_BY(mu_);  // what Forward returns
  Moves pending_ ABSL_GUARDED_BY(mu_);  // moves since the last Forward
  std::vector<StepRecord> steps_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, Action> actions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> kv_errors_ ABSL_GUARDED_BY(mu_);
};

// The characters of tokens 1 .. 63; token 0 is "<eos>".
inline constexpr std::string_view kFakeVocabChars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+";
inline constexpr int32_t kFakeVocab = 64;
inline constexpr int32_t kFakeEos = 0;

// A model without weights for FakeBackend: a 64-token byte-level tokenizer
// (no merges) and a config of that vocabulary and `max_position`. Its
// tokenizer is null if the tokenizer cannot be built.
inline LoadedModel FakeModel(int32_t max_position = 256) {
  models::TokenizerData data;
  data.model = models::TokenizerModel::kByteLevelBpe;
  data.pre = "gpt2";
  data.tokens.push_back("<eos>");
  data.token_types.push_back(models::TokenType::kControl);
  for (char c : kFakeVocabChars) {
    data.tokens.emplace_back(1, c);
    data.token_types.push_back(models::TokenType::kNormal);
  }
  data.eos_id = kFakeEos;
  LoadedModel m;
  m.path = "fake";
  m.format = "fake";
  m.config.name = "fake";
  m.config.architecture = "llama";
  m.config.num_layers = 1;
  m.config.hidden_size = 8;
  m.config.num_heads = 1;
  m.config.num_kv_heads = 1;
  m.config.head_dim = 8;
  m.config.intermediate_size = 8;
  m.config.vocab_size = kFakeVocab;
  m.config.max_position = max_position;
  auto tokenizer = models::Tokenizer::Create(std::move(data));
  if (tokenizer.ok()) m.tokenizer = *std::move(tokenizer);
  return m;
}

}  // namespace kvserve::engine::test
