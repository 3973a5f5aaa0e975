#include "engine/runner/draft_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engine/runner/kv_cache_storage.h"
#include "models/cpu/cpu_llama_model.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::engine {
namespace {

constexpr char kFlag[] = "--speculative-draft-model";

// The draft's tokens must mean what the target's mean: the same ids for the
// same pieces, and the same BOS/EOS.
absl::Status CheckSameTokenizer(const models::Tokenizer& draft,
                                const models::Tokenizer& target,
                                const std::string& path) {
  if (draft.vocab_size() != target.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFlag, " ", path, ": its vocabulary has ", draft.vocab_size(),
        " tokens, the target's ", target.vocab_size(),
        " (a draft model must share the target's tokenizer)"));
  }
  if (draft.bos_id() != target.bos_id() || draft.eos_id() != target.eos_id()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kFlag, " ", path,
                     ": its BOS/EOS tokens differ from the target's (a draft "
                     "model must share the target's tokenizer)"));
  }
  for (int32_t id = 0; id < target.vocab_size(); ++id) {
    if (draft.TokenToPiece(id) != target.TokenToPiece(id)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kFlag, " ", path, ": token ", id,
          " differs from the target's (a draft model must share the "
          "target's tokenizer)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::Create(
    const DraftModelConfig& config, const models::Tokenizer& target) {
  if (config.path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative draft needs ", kFlag));
  }
  absl::StatusOr<LoadedModel> loaded = LoadModel(config.path, Device::kCpu);
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat(kFlag, ": ", loaded.status().message()));
  }
  if (loaded->model == nullptr || loaded->config.IsMla()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kFlag, " ", config.path, ": not a Llama-family model the CPU runs"));
  }
  KV_RETURN_IF_ERROR(
      CheckSameTokenizer(*loaded->tokenizer, target, config.path));
  std::unique_ptr<DraftModel> d(new DraftModel(config, *std::move(loaded)));
  const models::ModelConfig& c = d->model_.config;
  const int32_t cap = std::min(config.max_model_len, c.max_position);
  d->blocks_per_slot_ = (cap + config.block_size - 1) / config.block_size;
  KvStorageConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.block_size = config.block_size;
  kc.num_blocks = config.max_seqs * d->blocks_per_slot_;
  kc.dtype = kvcache::KvDtype::kF16;
  KV_ASSIGN_OR_RETURN(d->kv_, KvCacheStorage::Create(kc));
  d->slots_.resize(config.max_seqs);
  return d;
}

DraftModel::DraftModel(const DraftModelConfig& config, LoadedModel model)
    : config_(config), model_(std::move(model)) {}

DraftModel::~DraftModel() = default;

void DraftModel::Forget(int64_t id) {
  auto it = slot_of_.find(id);
  if (it == slot_of_.end()) return;
  slots_[it->second] = Slot{};
  slot_of_.erase(it);
}

int32_t DraftModel::SlotFor(int64_t id, const std::vector<uint8_t>& busy) {
  if (auto it = slot_of_.find(id); it != slot_of_.end()) return it->second;
  int32_t pick = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(slots_.size()); ++i) {
    if (busy[i]) continue;
    if (slots_[i].id < 0) {
      pick = i;
      break;
    }
    if (pick < 0 || slots_[i].last_used < slots_[pick].last_used) pick = i;
  }
  if (pick < 0) return -1;
  if (slots_[pick].id >= 0) slot_of_.erase(slots_[pick].id);
  slots_[pick] = Slot{};
  slots_[pick].id = id;
  slot_of_[id] = pick;
  return pick;
}

void DraftModel::ResetBatch() {
  batch_.token_ids.clear();
  batch_.positions.clear();
  batch_.slot_mapping.clear();
  batch_.seq_starts.assign(1, 0);
  batch_.context_lens.clear();
  batch_.block_tables.clear();
  batch_.logits_rows.clear();
  batch_.max_blocks_per_seq = blocks_per_slot_;
}

void DraftModel::AddSegment(int32_t slot, const int32_t* tokens, int32_t begin,
                            int32_t n, bool want_logits) {
  const int32_t b = config_.block_size;
  const int32_t first_block = slot * blocks_per_slot_;
  for (int32_t t = 0; t < n; ++t) {
    const int32_t pos = begin + t;
    batch_.token_ids.push_back(tokens[t]);
    batch_.positions.push_back(pos);
    batch_.slot_mapping.push_back((first_block + pos / b) * b + pos % b);
  }
  batch_.seq_starts.push_back(batch_.num_tokens());
  batch_.context_lens.push_back(begin + n);
  for (int32_t k = 0; k < blocks_per_slot_; ++k) {
    batch_.block_tables.push_back(first_block + k);
  }
  if (want_logits) batch_.logits_rows.push_back(batch_.num_tokens() - 1);
  std::vector<int32_t>& held = slots_[slot].held;
  held.resize(begin);
  held.insert(held.end(), tokens, tokens + n);
}

absl::Status DraftModel::RunBatch(std::vector<int32_t>* argmax,
                                  std::vector<float>* top_prob) {
  argmax->clear();
  top_prob->clear();
  if (batch_.num_tokens() == 0) return absl::OkStatus();
  const absl::Time t0 = absl::Now();
  KV_RETURN_IF_ERROR(model_.model->Forward(batch_, kv_->view(), &logits_));
  forward_seconds_ += absl::ToDoubleSeconds(absl::Now() - t0);
  const int64_t vocab = model_.config.vocab_size;
  for (size_t r = 0; r < batch_.logits_rows.size(); ++r) {
    const float* row = logits_.data() + r * vocab;
    const float* best = std::max_element(row, row + vocab);
    argmax->push_back(static_cast<int32_t>(best - row));
    // The top probability matters only against a p_min above 0.
    double sum = 1;
    if (config_.p_min > 0) {
      sum = 0;
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(row[v] - *best);
    }
    top_prob->push_back(static_cast<float>(1.0 / sum));
  }
  return absl::OkStatus();
}

void DraftModel::Take(Run* run, int32_t token, float p) const {
  if (p < config_.p_min) {
    run->active = false;
    return;
  }
  run->drafts.push_back(token);
  run->active = static_cast<int32_t>(run->drafts.size()) < run->want;
}

absl::Status DraftModel::CatchUp(absl::Span<const DraftQuery> queries,
                                 std::vector<Run>* runs) {
  ResetBatch();
  std::vector<int32_t> rows;  // the run of each logits row
  std::vector<int32_t> lacking;
  int32_t budget = config_.max_catch_up_tokens;
  for (size_t i = 0; i < queries.size(); ++i) {
    Run& run = (*runs)[i];
    if (run.slot < 0) continue;
    const kvcache::TokenSequence& seq = queries[i].tokens;
    const auto prompt_len = static_cast<int32_t>(seq.prompt.size());
    auto at = [&](int32_t t) {
      return t < prompt_len ? seq.prompt[t] : seq.output[t - prompt_len];
    };
    // What the slot holds of the sequence; its last token is fed again
    // whatever, for the logits that draft the next.
    const std::vector<int32_t>& held = slots_[run.slot].held;
    const int32_t limit =
        std::min(static_cast<int32_t>(held.size()), run.size - 1);
    int32_t same = 0;
    while (same < limit && held[same] == at(same)) ++same;
    const int32_t n = std::min(run.size - same, budget);
    if (n <= 0) continue;
    budget -= n;
    lacking.resize(n);
    seq.Copy(same, n, lacking.data());
    const bool whole = same + n == run.size;
    AddSegment(run.slot, lacking.data(), same, n, whole);
    if (whole) rows.push_back(static_cast<int32_t>(i));
  }
  std::vector<int32_t> argmax;
  std::vector<float> prob;
  KV_RETURN_IF_ERROR(RunBatch(&argmax, &prob));
  for (size_t r = 0; r < rows.size(); ++r) {
    Take(&(*runs)[rows[r]], argmax[r], prob[r]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<int32_t>>> DraftModel::Propose(
    absl::Span<const DraftQuery> queries) {
  ++calls_;
  const int32_t cap = blocks_per_slot_ * config_.block_size;
  std::vector<uint8_t> busy(slots_.size(), 0);
  std::vector<Run> runs(queries.size());
  for (size_t i = 0; i < queries.size(); ++i) {
    const DraftQuery& q = queries[i];
    Run& run = runs[i];
    run.size = q.tokens.size();
    // Drafts 1 .. want-1 are fed at positions size .. size + want - 2.
    run.want = std::min(q.max_tokens, cap - run.size + 1);
    if (run.want <= 0 || run.size < 1) continue;
    run.slot = SlotFor(q.id, busy);
    if (run.slot < 0) continue;
    busy[run.slot] = 1;
    slots_[run.slot].last_used = calls_;
  }
  KV_RETURN_IF_ERROR(CatchUp(queries, &runs));
  std::vector<int32_t> argmax;
  std::vector<float> prob;
  std::vector<int32_t> rows;
  for (;;) {
    ResetBatch();
    rows.clear();
    for (size_t i = 0; i < runs.size(); ++i) {
      Run& run = runs[i];
      if (!run.active) continue;
      const auto fed = static_cast<int32_t>(run.drafts.size()) - 1;
      AddSegment(run.slot, &run.drafts.back(), run.size + fed, 1, true);
      rows.push_back(static_cast<int32_t>(i));
    }
    if (rows.empty()) break;
    KV_RETURN_IF_ERROR(RunBatch(&argmax, &prob));
    for (size_t r = 0; r < rows.size(); ++r) {
      Take(&runs[rows[r]], argmax[r], prob[r]);
    }
  }
  std::vector<std::vector<int32_t>> out(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) out[i] = std::move(runs[i].drafts);
  return out;
}

}  // namespace kvserve::engine
