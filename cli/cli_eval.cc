#include "cli/cli_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "cli/engine_flags.h"
#include "common/cli_args.h"
#include "common/clock.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "engine/runner/kv_cache_storage.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/platform.h"
#include "kvcache/kv_format.h"
#include "kvcache/kv_sizing.h"
#include "models/cpu/cpu_llama_model.h"
#include "models/forward_batch.h"
#include "nlohmann/json.hpp"
#include "scheduler/request.h"
#include "server/kv_policy.h"

// The default text, baked in at build time as an absolute path into the
// source tree (server/CMakeLists.txt); a binary built without it looks in
// the working directory.
#ifndef KVSERVE_EVAL_DEFAULT_TEXT
#define KVSERVE_EVAL_DEFAULT_TEXT "tests/data/eval/gpl-3.0.txt"
#endif

namespace kvserve::cli {
namespace {

// Blocks of the windowed lanes (whose drops are whole blocks, as the
// server's default block size), and of the full-cache lanes (whole key
// groups for int3/int2; a full cache's results do not depend on it).
constexpr int32_t kBlockSize = 16;
constexpr int32_t kFullBlockSize = kvcache::kKvKeyGroupTokens;
static_assert(kFullBlockSize % kBlockSize == 0);

struct EvalFlags {
  // --model and --threads; eval runs on the CPU and takes its own list of
  // KV dtypes.
  EngineFlags engine =
      EngineFlagsFrom(engine::EngineConfig(), "smollm2-135m", "cpu");
  std::string text = KVSERVE_EVAL_DEFAULT_TEXT;
  std::string kv_cache_dtype = "f32,fp16,bf16,int8,int4";
  // ';'-separated kv_policy flags ("streaming:sinks=N,window=M",
  // "heavy_hitters:sinks=N,window=M,budget=B"), each an
  // f32 lane whose cache drops as the server's would; ",positions=written"
  // after one scores its sinks at their written positions instead.
  std::string kv_policy;
  int64_t context = 512;
  int64_t chunk = 0;  // 0: 64, or one key group with an int3/int2 lane
  int64_t max_windows = 0;
  // --context may pass the model's trained context (with --kv-policy only):
  // the full-cache lanes then run where the model was never trained, and
  // the windowed lanes show what their positions rule does there.
  bool past_trained_context = false;
  bool json = false;
};

// Sums over the scored positions of one KV dtype.
struct DtypeStats {
  double sum_nll = 0.0, sum_nll2 = 0.0, sum_kld = 0.0;
  int64_t agree = 0, scored = 0;
};

// One KV dtype's (or bounded policy's) own cache, the logits of its latest
// chunk, and its sums. A lane with a window keeps a block table of its own
// that drops blocks between chunks as Scheduler::DropOutOfWindow does.
struct Lane {
  kvcache::KvDtype dtype = kvcache::KvDtype::kF32;
  scheduler::KvWindow window;  // disabled: the full cache
  std::string policy = "full";
  // The server's positions within the cache (sinks scored by the query at
  // its KV index), or the positions tokens were written at (no sink_lens).
  bool positions_as_written = false;
  std::unique_ptr<engine::KvCacheStorage> kv;
  std::vector<float> logits;
  DtypeStats stats;
  std::vector<int32_t> table, free_blocks;  // windowed lanes only
  // Heavy hitters, per table entry: attention mass accumulated, and the
  // query tokens that contributed to it.
  std::vector<float> mass, seen;
  int32_t dropped = 0;
  int32_t peak_held = 0;  // most KV tokens held at once
  models::ForwardBatch batch;
};

// What one scored position contributes to one lane.
struct RowScore {
  double nll = 0.0, kld = 0.0;
  bool agree = false;
};

// Names, in order and without repeats, of the dtypes in `list`; errors name
// --kv-cache-dtype.
absl::StatusOr<std::vector<kvcache::KvDtype>> ParseDtypeList(
    const std::string& list) {
  std::vector<kvcache::KvDtype> out;
  for (absl::string_view name : absl::StrSplit(list, ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (name.empty()) continue;
    absl::StatusOr<kvcache::KvDtype> d =
        kvcache::ParseKvDtype(std::string_view(name.data(), name.size()));
    if (!d.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-dtype: ", d.status().message()));
    }
    if (std::find(out.begin(), out.end(), *d) == out.end()) out.push_back(*d);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError("--kv-cache-dtype: no dtype given");
  }
  return out;
}

// One --kv-policy entry: its text, window and position rule.
struct EvalPolicy {
  std::string text;
  scheduler::KvWindow window;
  bool positions_as_written = false;
};

// The --kv-policy list, "full" entries skipped. An entry may end in
// ",positions=written" (eval only: the rule the server does not use, to
// measure what in-cache positions buy).
absl::StatusOr<std::vector<EvalPolicy>> ParsePolicyList(
    const std::string& list) {
  constexpr absl::string_view kWritten = ",positions=written";
  std::vector<EvalPolicy> out;
  for (absl::string_view item : absl::StrSplit(list, ';', absl::SkipEmpty())) {
    item = absl::StripAsciiWhitespace(item);
    EvalPolicy p{std::string(item), {}, absl::ConsumeSuffix(&item, kWritten)};
    KV_ASSIGN_OR_RETURN(p.window, server::ParseKvPolicyFlag(item));
    if (p.window.enabled()) out.push_back(std::move(p));
  }
  return out;
}

// The default --chunk: 64 tokens, or one key group (32) when an int3/int2
// lane needs a chunk dividing it (ValidateFlags).
void ResolveChunk(EvalFlags* f) {
  if (f->chunk > 0) return;
  f->chunk = 64;
  const auto dtypes = ParseDtypeList(f->kv_cache_dtype);
  if (!dtypes.ok()) return;  // ValidateFlags says why
  for (kvcache::KvDtype d : *dtypes) {
    if (kvcache::KvLowBits(d) > 0) f->chunk = kvcache::kKvKeyGroupTokens;
  }
}

absl::Status ValidateFlags(const EvalFlags& f) {
  if (f.context % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--context %d: must be even (its second half is scored)", f.context));
  }
  if (f.context < 2 * f.chunk) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--context %d: must be at least 2 x --chunk (%d)",
                        f.context, 2 * f.chunk));
  }
  KV_ASSIGN_OR_RETURN(const auto dtypes, ParseDtypeList(f.kv_cache_dtype));
  // int3/int2 read the key groups a forward writes in full precision (KIVI's
  // residual): a chunk that spans groups would see more of its context
  // exactly than a decode step does.
  constexpr int64_t kGroup = kvcache::kKvKeyGroupTokens;
  for (kvcache::KvDtype d : dtypes) {
    if (kvcache::KvLowBits(d) > 0 && kGroup % f.chunk != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--chunk %d: the %s lane needs a chunk dividing %d (its newest key "
          "group is read in full precision, as a decode step reads it)",
          f.chunk, std::string(kvcache::KvDtypeName(d)), kGroup));
    }
  }
  return ParsePolicyList(f.kv_policy).status();
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text ", path, ": cannot be read"));
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Natural-log probabilities of `logits`, in double.
void LogSoftmax(absl::Span<const float> logits, std::vector<double>* out) {
  out->resize(logits.size());
  double max = -INFINITY;
  for (float x : logits) max = std::max(max, static_cast<double>(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double lse = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = logits[i] - lse;
}

// The lowest index of the largest logit (std::max_element's tie rule).
int64_t Argmax(absl::Span<const float> row) {
  return std::max_element(row.begin(), row.end()) - row.begin();
}

// Scores row `row` of `lane` against the reference's log-probabilities:
// NLL of `target`, KL(reference || lane) over the whole vocabulary, and
// whether both put their largest logit on the same token.
RowScore ScoreRow(const Lane& lane, int64_t row, int64_t vocab, int32_t target,
                  const std::vector<double>& ref_lp, int64_t ref_argmax,
                  std::vector<double>* lp) {
  const absl::Span<const float> logits(lane.logits.data() + row * vocab, vocab);
  LogSoftmax(logits, lp);
  RowScore s;
  s.nll = -(*lp)[target];
  for (int64_t j = 0; j < vocab; ++j) {
    s.kld += std::exp(ref_lp[j]) * (ref_lp[j] - (*lp)[j]);
  }
  s.agree = Argmax(logits) == ref_argmax;
  return s;
}

// Scores every logits row of the chunk for every lane (lanes[0] is the f32
// reference, scored against itself), rows in parallel, then adds the
// scores to each lane's sums in row order so the totals do not depend on
// the thread count. targets[i] is the token row i predicts.
void ScoreChunk(absl::Span<const int32_t> targets, int64_t vocab,
                std::vector<Lane*>& lanes) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  std::vector<RowScore> scores(rows * lanes.size());
  ParallelForEach(rows, [&](int64_t r) {
    std::vector<double> ref_lp, lp;
    const Lane& ref = *lanes[0];
    LogSoftmax({ref.logits.data() + r * vocab, static_cast<size_t>(vocab)},
               &ref_lp);
    const int64_t ref_argmax =
        Argmax({ref.logits.data() + r * vocab, static_cast<size_t>(vocab)});
    for (size_t l = 0; l < lanes.size(); ++l) {
      scores[r * lanes.size() + l] =
          ScoreRow(*lanes[l], r, vocab, targets[r], ref_lp, ref_argmax, &lp);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    for (size_t l = 0; l < lanes.size(); ++l) {
      const RowScore& s = scores[r * lanes.size() + l];
      DtypeStats& st = lanes[l]->stats;
      st.sum_nll += s.nll;
      st.sum_nll2 += s.nll * s.nll;
      st.sum_kld += s.kld;
      st.agree += s.agree ? 1 : 0;
      ++st.scored;
    }
  }
}

// The batch of window tokens [off, off + n) at KV positions [off, off + n)
// of one sequence whose blocks are 0, 1, 2, ... in order. Logits are asked
// for the rows llama-perplexity scores: positions first .. window - 2, each
// predicting the next token; a chunk without any asks for its last row
// only (and is not scored).
void BuildChunk(absl::Span<const int32_t> window, int32_t off, int32_t n,
                int32_t first, models::ForwardBatch* batch,
                std::vector<int32_t>* targets) {
  const int32_t last_scored = static_cast<int32_t>(window.size()) - 2;
  batch->token_ids.assign(window.begin() + off, window.begin() + off + n);
  batch->positions.resize(n);
  batch->slot_mapping.resize(n);
  batch->logits_rows.clear();
  targets->clear();
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = off + i;
    batch->positions[i] = pos;
    batch->slot_mapping[i] = pos;  // block pos / B, slot pos % B
    if (pos >= first && pos <= last_scored) {
      batch->logits_rows.push_back(i);
      targets->push_back(window[pos + 1]);
    }
  }
  const int32_t new_len = off + n;
  batch->seq_starts = {0, n};
  batch->context_lens = {new_len};
  batch->max_blocks_per_seq = (new_len + kFullBlockSize - 1) / kFullBlockSize;
  batch->block_tables.resize(batch->max_blocks_per_seq);
  for (int32_t b = 0; b < batch->max_blocks_per_seq; ++b) {
    batch->block_tables[b] = b;
  }
  if (batch->logits_rows.empty()) batch->logits_rows = {n - 1};
}

// `base` (a chunk at KV positions = window positions) for a windowed lane:
// first drops the blocks past its sinks that fell out of its window before
// this chunk, then writes the chunk at KV index position - dropped with RoPE
// at the position, through the lane's compacted table.
void WindowChunk(const models::ForwardBatch& base, int32_t off, int32_t n,
                 Lane* lane) {
  if (lane->window.heavy_hitters()) {
    lane->mass.resize(lane->table.size(), 0.0f);
    lane->seen.resize(lane->table.size(), 0.0f);
    for (const int32_t b : scheduler::HeavyHitterDrops(
             lane->window, off - lane->dropped,
             scheduler::MeanAttention(lane->mass, lane->seen), kBlockSize)) {
      lane->free_blocks.push_back(lane->table[b]);
      lane->table.erase(lane->table.begin() + b);
      lane->mass.erase(lane->mass.begin() + b);
      lane->seen.erase(lane->seen.begin() + b);
      lane->dropped += kBlockSize;
    }
  } else {
    const auto [first, count] = scheduler::BlocksOutOfWindow(
        lane->window, off, lane->dropped, kBlockSize);
    auto begin = lane->table.begin() + first;
    lane->free_blocks.insert(lane->free_blocks.end(), begin, begin + count);
    lane->table.erase(begin, begin + count);
    lane->dropped += count * kBlockSize;
  }
  const int32_t held = off + n - lane->dropped;
  lane->peak_held = std::max(lane->peak_held, held);
  while (static_cast<int32_t>(lane->table.size()) * kBlockSize < held) {
    lane->table.push_back(lane->free_blocks.back());
    lane->free_blocks.pop_back();
  }
  models::ForwardBatch& b = lane->batch;
  b = base;
  b.rope_positions = base.positions;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t kv = off + i - lane->dropped;
    b.positions[i] = kv;
    b.slot_mapping[i] =
        lane->table[kv / kBlockSize] * kBlockSize + kv % kBlockSize;
  }
  b.context_lens = {held};
  b.sink_lens.clear();
  if (lane->dropped > 0 && !lane->positions_as_written &&
      !lane->window.heavy_hitters()) {
    b.sink_lens = {lane->window.SinkBlocks(kBlockSize) * kBlockSize};
  }
  b.mass_seqs.clear();
  if (lane->window.heavy_hitters()) b.mass_seqs = {1};
  b.block_tables = lane->table;
  b.max_blocks_per_seq = static_cast<int32_t>(lane->table.size());
}

// A windowed lane's empty table and free blocks, before each text window.
void ResetWindow(Lane* lane) {
  const int32_t blocks = lane->kv->num_blocks();
  lane->table.clear();
  lane->mass.clear();
  lane->free_blocks.resize(blocks);
  for (int32_t i = 0; i < blocks; ++i) lane->free_blocks[i] = blocks - 1 - i;
  lane->dropped = 0;
}

// Teacher-forces one window through every lane's cache, chunk by chunk
// (each chunk attends to the earlier chunks' K/V as stored in that lane's
// dtype), and scores the second half.
absl::Status RunWindow(models::CpuLlamaModel* model,
                       absl::Span<const int32_t> window, int32_t chunk,
                       std::vector<Lane*>& lanes) {
  const int32_t ctx = static_cast<int32_t>(window.size());
  const int64_t vocab = model->config().vocab_size;
  models::ForwardBatch batch;
  std::vector<int32_t> targets;
  for (Lane* lane : lanes) {
    if (lane->window.enabled()) ResetWindow(lane);
  }
  for (int32_t off = 0; off < ctx; off += chunk) {
    const int32_t n = std::min(chunk, ctx - off);
    BuildChunk(window, off, n, ctx / 2, &batch, &targets);
    for (Lane* lane : lanes) {
      if (lane->window.enabled()) WindowChunk(batch, off, n, lane);
      const models::ForwardBatch& b =
          lane->window.enabled() ? lane->batch : batch;
      KV_RETURN_IF_ERROR(model->Forward(b, lane->kv->view(), &lane->logits));
      if (lane->window.heavy_hitters()) {
        const std::vector<float>& m = model->block_mass();
        lane->mass.resize(lane->table.size(), 0.0f);
        lane->seen.resize(lane->table.size(), 0.0f);
        for (size_t k = 0; k < lane->mass.size() && k < m.size(); ++k) {
          lane->mass[k] += m[k];
          lane->seen[k] += n;
        }
      }
    }
    if (!targets.empty()) ScoreChunk(targets, vocab, lanes);
  }
  return absl::OkStatus();
}

struct EvalResult {
  std::string model_path;
  int64_t text_tokens = 0, windows = 0, windows_available = 0;
  int32_t trained_context = 0;  // the model's max_position
  bool add_bos = false;
  kvcache::KvShape shape;
  std::vector<kvcache::KvDtype> dtypes;  // as requested
  std::vector<DtypeStats> stats;         // per dtype
  // Bounded policies (f32 KV), as requested: flag text, sums, peak tokens.
  std::vector<std::string> policies;
  std::vector<DtypeStats> policy_stats;
  std::vector<int32_t> policy_peak_tokens;
};

double Ppl(const DtypeStats& s) { return std::exp(s.sum_nll / s.scored); }

// Standard error of the perplexity (delta method on the mean NLL), as
// llama-perplexity prints it.
double PplStderr(const DtypeStats& s) {
  if (s.scored < 2) return 0.0;
  const double mean = s.sum_nll / s.scored;
  const double var = std::max(0.0, s.sum_nll2 / s.scored - mean * mean);
  return Ppl(s) * std::sqrt(var / (s.scored - 1));
}

int64_t BlocksPerGib(const kvcache::KvShape& shape, kvcache::KvDtype d) {
  return (int64_t{1} << 30) /
         kvcache::KvBytesPerBlock(
             shape, d, kvcache::KvDtypeDefaultBlockSize(d, kBlockSize));
}

std::string FormatTable(const EvalFlags& f, const EvalResult& r) {
  std::string out = absl::StrFormat(
      "model: %s\ntext: %s (%d tokens%s)\ncontext %d, chunk %d, %d of %d "
      "windows, %d tokens scored per dtype\n\n",
      r.model_path, f.text, r.text_tokens, r.add_bos ? ", BOS added" : "",
      f.context, f.chunk, r.windows, r.windows_available,
      r.stats.empty() ? 0 : r.stats[0].scored);
  if (f.context > r.trained_context) {
    absl::StrAppend(
        &out, absl::StrFormat("the full cache runs past the model's trained "
                              "context of %d: compare the policies' PPL\n\n",
                              r.trained_context));
  }
  absl::StrAppend(&out, absl::StrFormat("%-6s %-18s %9s %10s %8s %10s %10s\n",
                                        "dtype", "PPL", "dPPL", "mean KLD",
                                        "top-1", "bytes/tok", "blocks/GiB"));
  const DtypeStats* ref = nullptr;
  for (size_t i = 0; i < r.dtypes.size(); ++i) {
    if (r.dtypes[i] == kvcache::KvDtype::kF32) ref = &r.stats[i];
  }
  for (size_t i = 0; i < r.dtypes.size(); ++i) {
    const DtypeStats& s = r.stats[i];
    const std::string dppl =
        ref != nullptr
            ? absl::StrFormat("%+.3f%%", (Ppl(s) / Ppl(*ref) - 1.0) * 100.0)
            : "n/a";
    absl::StrAppend(
        &out,
        absl::StrFormat("%-6s %-18s %9s %10.6f %7.2f%% %10d %10d\n",
                        kvcache::KvDtypeName(r.dtypes[i]),
                        absl::StrFormat("%.4f +/- %.4f", Ppl(s), PplStderr(s)),
                        dppl, s.sum_kld / s.scored, 100.0 * s.agree / s.scored,
                        kvcache::KvBytesPerToken(r.shape, r.dtypes[i]),
                        BlocksPerGib(r.shape, r.dtypes[i])));
  }
  if (ref == nullptr) {
    absl::StrAppend(&out,
                    "(f32 not listed: dPPL is not shown; KLD and top-1 "
                    "are still against f32 KV)\n");
  }
  if (!r.policies.empty()) {
    absl::StrAppend(
        &out,
        absl::StrFormat("\n%-34s %-18s %10s %8s %10s  (f32 KV, vs the "
                        "full cache; drops between chunks)\n",
                        "kv policy", "PPL", "mean KLD", "top-1", "peak KV"));
  }
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const DtypeStats& s = r.policy_stats[i];
    absl::StrAppend(
        &out,
        absl::StrFormat("%-34s %-18s %10.6f %7.2f%% %10d\n", r.policies[i],
                        absl::StrFormat("%.4f +/- %.4f", Ppl(s), PplStderr(s)),
                        s.sum_kld / s.scored, 100.0 * s.agree / s.scored,
                        r.policy_peak_tokens[i]));
  }
  return out;
}

std::string FormatJson(const EvalFlags& f, const EvalResult& r) {
  nlohmann::ordered_json j;
  j["model"] = r.model_path;
  j["text"] = f.text;
  j["text_tokens"] = r.text_tokens;
  j["add_bos"] = r.add_bos;
  j["context"] = f.context;
  j["trained_context"] = r.trained_context;
  j["chunk"] = f.chunk;
  j["windows"] = r.windows;
  j["windows_available"] = r.windows_available;
  j["block_size"] = kBlockSize;
  // The f32 reference always runs; its perplexity anchors delta_ppl_pct.
  double ref_ppl = NAN;
  for (size_t i = 0; i < r.dtypes.size(); ++i) {
    if (r.dtypes[i] == kvcache::KvDtype::kF32) ref_ppl = Ppl(r.stats[i]);
  }
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.dtypes.size(); ++i) {
    const DtypeStats& s = r.stats[i];
    nlohmann::ordered_json row;
    row["kv_dtype"] = std::string(kvcache::KvDtypeName(r.dtypes[i]));
    row["ppl"] = Ppl(s);
    row["ppl_stderr"] = PplStderr(s);
    if (std::isnan(ref_ppl)) {
      row["delta_ppl_pct"] = nullptr;
    } else {
      row["delta_ppl_pct"] = (Ppl(s) / ref_ppl - 1.0) * 100.0;
    }
    row["mean_kld"] = s.sum_kld / s.scored;
    row["top1_agreement_pct"] = 100.0 * s.agree / s.scored;
    row["bytes_per_token"] = kvcache::KvBytesPerToken(r.shape, r.dtypes[i]);
    row["block_size"] =
        kvcache::KvDtypeDefaultBlockSize(r.dtypes[i], kBlockSize);
    row["blocks_per_gib"] = BlocksPerGib(r.shape, r.dtypes[i]);
    row["tokens_scored"] = s.scored;
    rows.push_back(std::move(row));
  }
  j["results"] = std::move(rows);
  nlohmann::ordered_json policies = nlohmann::ordered_json::array();
  for (size_t i = 0; i < r.policies.size(); ++i) {
    const DtypeStats& s = r.policy_stats[i];
    policies.push_back({{"kv_policy", r.policies[i]},
                        {"kv_dtype", "f32"},
                        {"ppl", Ppl(s)},
                        {"ppl_stderr", PplStderr(s)},
                        {"mean_kld", s.sum_kld / s.scored},
                        {"top1_agreement_pct", 100.0 * s.agree / s.scored},
                        {"peak_kv_tokens", r.policy_peak_tokens[i]},
                        {"tokens_scored", s.scored}});
  }
  j["policies"] = std::move(policies);
  return j.dump(2) + "\n";
}

// The f32 reference lane first, then one lane per other requested dtype,
// each with a cache of one window.
absl::StatusOr<std::vector<Lane>> MakeLanes(
    const models::ModelConfig& c, const std::vector<kvcache::KvDtype>& dtypes,
    const std::vector<EvalPolicy>& policies, int64_t context) {
  std::vector<kvcache::KvDtype> lane_dtypes = {kvcache::KvDtype::kF32};
  for (kvcache::KvDtype d : dtypes) {
    KV_ASSIGN_OR_RETURN(kvcache::KvDtype cpu,
                        engine::PlatformFor(engine::Device::kCpu)
                            .ResolveKvDtype(d, c.head_dim));
    if (cpu != kvcache::KvDtype::kF32) lane_dtypes.push_back(cpu);
  }
  const size_t full_lanes = lane_dtypes.size();
  std::vector<Lane> lanes(full_lanes + policies.size());
  for (size_t i = 0; i < policies.size(); ++i) {
    Lane& l = lanes[full_lanes + i];
    l.policy = policies[i].text;
    l.window = policies[i].window;
    l.positions_as_written = policies[i].positions_as_written;
    lane_dtypes.push_back(kvcache::KvDtype::kF32);
  }
  for (size_t i = 0; i < lanes.size(); ++i) {
    lanes[i].dtype = lane_dtypes[i];
    const int32_t bs = i < full_lanes ? kFullBlockSize : kBlockSize;
    KV_ASSIGN_OR_RETURN(lanes[i].kv,
                        engine::KvCacheStorage::Create(
                            {c.num_layers, c.num_kv_heads, c.head_dim, bs,
                             static_cast<int32_t>((context + bs - 1) / bs), 0,
                             lane_dtypes[i]}));
  }
  return lanes;
}

absl::StatusOr<EvalResult> Evaluate(const EvalFlags& f) {
  if (f.engine.threads > 0) {
    SetNumThreads(static_cast<int>(f.engine.threads));
  }
  KV_ASSIGN_OR_RETURN(std::vector<kvcache::KvDtype> dtypes,
                      ParseDtypeList(f.kv_cache_dtype));
  KV_ASSIGN_OR_RETURN(const std::string text, ReadText(f.text));
  KV_ASSIGN_OR_RETURN(engine::LoadedModel m,
                      engine::LoadModel(f.engine.model, engine::Device::kCpu));
  KV_ASSIGN_OR_RETURN(const auto policies, ParsePolicyList(f.kv_policy));
  KV_ASSIGN_OR_RETURN(std::vector<Lane> lanes,
                      MakeLanes(m.config, dtypes, policies, f.context));
  EvalResult r;
  r.model_path = m.path;
  r.dtypes = dtypes;
  r.shape = {m.config.num_layers, m.config.num_kv_heads, m.config.head_dim};
  r.add_bos = m.tokenizer->data().add_bos;
  const std::vector<int32_t> tokens =
      m.tokenizer->Encode(text, /*add_special=*/true, /*parse_special=*/false);
  r.text_tokens = static_cast<int64_t>(tokens.size());
  r.windows_available = r.text_tokens / f.context;
  if (r.windows_available == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--text %s: %d tokens, fewer than one window of --context %d", f.text,
        r.text_tokens, f.context));
  }
  r.trained_context = m.config.max_position;
  if (f.context > m.config.max_position &&
      (!f.past_trained_context || policies.empty())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--context %d: exceeds the model's context of %d",
                        f.context, m.config.max_position));
  }
  r.windows = f.max_windows > 0 ? std::min(f.max_windows, r.windows_available)
                                : r.windows_available;
  std::vector<Lane*> order;
  order.reserve(lanes.size());
  for (Lane& l : lanes) order.push_back(&l);
  std::vector<int32_t> window(f.context);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < r.windows; ++w) {
    std::copy_n(tokens.begin() + w * f.context, f.context, window.begin());
    if (r.add_bos) window[0] = m.tokenizer->bos_id();
    KV_RETURN_IF_ERROR(
        RunWindow(m.model.get(), window, static_cast<int32_t>(f.chunk), order));
    std::fprintf(stderr, "window %lld/%lld: f32 ppl so far %.4f (%.1f s)\n",
                 static_cast<long long>(w) + 1,
                 static_cast<long long>(r.windows), Ppl(lanes[0].stats),
                 SecondsSince(t0));
  }
  for (kvcache::KvDtype d : dtypes) {
    for (const Lane& l : lanes) {
      if (l.dtype == d && !l.window.enabled()) r.stats.push_back(l.stats);
    }
  }
  for (const Lane& l : lanes) {
    if (!l.window.enabled()) continue;
    r.policies.push_back(l.policy);
    r.policy_stats.push_back(l.stats);
    r.policy_peak_tokens.push_back(l.peak_held);
  }
  return r;
}

}  // namespace

int RunEvalCommand(int argc, const char* const* argv) {
  EvalFlags f;
  bool help = false;
  CliArgs args("eval");
  RegisterEngineFlags(&f.engine, kModelFlags, &args);
  args.String("text", &f.text,
              "UTF-8 text to score (default: the source tree's "
              "tests/data/eval/gpl-3.0.txt, path fixed at build time: " +
                  std::string(KVSERVE_EVAL_DEFAULT_TEXT) + ")");
  args.String("kv-cache-dtype", &f.kv_cache_dtype,
              "comma-separated KV dtypes to measure against f32 KV "
              "(f32, fp16, bf16, int8, int4, int3, int2)");
  args.String("kv-policy", &f.kv_policy,
              "';'-separated bounded KV policies to measure against the full "
              "cache with f32 KV, e.g. \"streaming:sinks=4,window=1024\" or "
              "\"heavy_hitters:sinks=4,window=256,budget=1088\" (each drops "
              "whole blocks between chunks, as the server does "
              "between steps; \",positions=written\" after one keeps the "
              "sinks at their written positions, for comparison)");
  args.Int("context", &f.context,
           "window length in tokens (even, >= 2 x --chunk); the second "
           "half of each window is scored",
           2, 1 << 20);
  args.Int("chunk", &f.chunk,
           "prefill chunk in tokens (default 64; 32 with an int3 or int2 "
           "lane)",
           1, 1 << 20);
  args.Int("max-windows", &f.max_windows, "windows to score (0: all)", 0,
           INT64_MAX);
  args.Bool("past-trained-context", &f.past_trained_context,
            "allow --context past the model's trained context, with "
            "--kv-policy (the full cache is then untrained there; compare "
            "the policies' PPL)");
  args.Bool("json", &f.json, "print one JSON object");
  args.Bool("help", &help, "show this help");
  absl::Status s = args.Parse(argc, argv, 2);
  if (help) {
    std::fputs(args.Usage().c_str(), stdout);
    return 0;
  }
  ResolveChunk(&f);
  if (s.ok()) s = ValidateFlags(f);
  if (!s.ok()) {
    std::fprintf(stderr, "kvserve: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<EvalResult> r = Evaluate(f);
  if (!r.ok()) {
    std::fprintf(stderr, "kvserve eval: %s\n", r.status().ToString().c_str());
    return absl::IsInvalidArgument(r.status()) ? 2 : 1;
  }
  const std::string out = f.json ? FormatJson(f, *r) : FormatTable(f, *r);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace kvserve::cli
