// The draft model of speculative decoding (--speculative draft): a smaller
// model with the target's tokenizer proposes each speculating sequence's
// next tokens, greedily, in batched forwards of its own over a KV pool of
// its own (a draft's KV never enters the target's pool, prefix cache, tiers
// or KV events). The target verifies the proposals in its batched step
// (ModelRunner::SampleAll); a greedy draft is a one-hot proposal, for which
// sampling the target and comparing is the exact rejection rule, so the
// outputs are the target's whatever the draft says.
//
// Per sequence the pool holds one slot of ceil(max_model_len / block_size)
// contiguous blocks (reserved, committed as written: KvCacheStorage) and the
// tokens whose K/V the slot holds, in order. A proposal first feeds the
// tokens the slot lacks (the longest common prefix of what it holds and the
// sequence's tokens is kept, so rejected drafts, preemption and forks need
// no bookkeeping: a mismatch is overwritten), then one token per further
// draft. Slots beyond max_seqs go to the least recently proposed sequence.
//
// Thread safety: none; the engine thread alone calls it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/runner/loaded_model.h"
#include "kvcache/kv_cache_manager.h"
#include "models/forward_batch.h"

namespace kvserve::engine {

class KvCacheStorage;

struct DraftModelConfig {
  std::string path;           // --speculative-draft-model
  int32_t max_seqs = 8;       // sequences holding draft KV at once
  int32_t max_model_len = 0;  // tokens a slot holds (the target's limit)
  int32_t block_size = 16;
  // A sequence's drafting stops at a token the draft gives less than this
  // probability (llama.cpp's --spec-draft-p-min, whose default is 0 too):
  // a likely rejection is not worth its share of the verifying forward.
  float p_min = 0.0f;
  // Prompt tokens the draft catches up on per call, over all sequences; a
  // sequence still behind proposes nothing, so a long prompt does not stall
  // the step.
  int32_t max_catch_up_tokens = 512;
};

// One sequence to draft for: its tokens (prompt and output) and the most
// drafts wanted.
struct DraftQuery {
  int64_t id = 0;
  kvcache::TokenSequence tokens;
  int32_t max_tokens = 0;
};

class DraftModel {
 public:
  // Loads `config.path` on the CPU and checks that its tokenizer is the
  // target's (same vocabulary, token for token, and the same BOS/EOS):
  // InvalidArgument naming --speculative-draft-model otherwise.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DraftModel>> Create(
      const DraftModelConfig& config, const models::Tokenizer& target);
  ~DraftModel();

  // Up to queries[i].max_tokens drafts for each query (empty: none this
  // step). Fails only when the draft's forward fails.
  [[nodiscard]] absl::StatusOr<std::vector<std::vector<int32_t>>> Propose(
      absl::Span<const DraftQuery> queries);
  // Frees `id`'s slot (it ended); no-op for an id without one.
  void Forget(int64_t id);

  const std::string& path() const { return model_.path; }
  // Wall seconds of the draft's forwards so far.
  double forward_seconds() const { return forward_seconds_; }

 private:
  struct Slot {
    int64_t id = -1;            // -1: free
    std::vector<int32_t> held;  // tokens at positions 0 .. held.size()-1
    int64_t last_used = 0;
  };
  // One query's progress through a Propose call.
  struct Run {
    int32_t slot = -1;
    int32_t size = 0;     // the sequence's tokens
    int32_t want = 0;     // drafts wanted
    bool active = false;  // still drafting
    std::vector<int32_t> drafts;
  };

  DraftModel(const DraftModelConfig& config, LoadedModel model);

  // The slot of `id`, taking a free one or the least recently used one not
  // in `busy`; -1 when none is left.
  int32_t SlotFor(int64_t id, const std::vector<uint8_t>& busy);
  // Adds `n` tokens of `tokens` from `begin` to batch_ for slot `slot`
  // (written at positions begin ..), and records them as held.
  void AddSegment(int32_t slot, const int32_t* tokens, int32_t begin, int32_t n,
                  bool want_logits);
  // Runs batch_ and appends each logits row's argmax and its probability
  // (1 when p_min is 0: then it is never compared, so not computed).
  [[nodiscard]] absl::Status RunBatch(std::vector<int32_t>* argmax,
                                      std::vector<float>* top_prob);
  // The catch-up forward of a Propose call: the tokens each slot lacks;
  // runs whose sequence is then fed in full get their first draft.
  [[nodiscard]] absl::Status CatchUp(absl::Span<const DraftQuery> queries,
                                     std::vector<Run>* runs);
  // Keeps draft `token` of probability `p` for `run` (or ends it).
  void Take(Run* run, int32_t token, float p) const;
  void ResetBatch();

  DraftModelConfig config_;
  LoadedModel model_;
  std::unique_ptr<KvCacheStorage> kv_;
  int32_t blocks_per_slot_ = 0;
  std::vector<Slot> slots_;
  absl::flat_hash_map<int64_t, int32_t> slot_of_;
  int64_t calls_ = 0;
  models::ForwardBatch batch_;
  std::vector<float> logits_;
  double forward_seconds_ = 0;
};

}  // namespace kvserve::engine
