#include "engine/runner/sim_backend.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/platform.h"
#include "models/loader/presets.h"
#include "models/sim/gpu_specs.h"
#include "models/sim/memory_budget.h"
#include "models/sim/roofline.h"
#include "models/sim/step_profile.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

// The logit of a simulated token in a row a sampler reads; the others are 0,
// so the token holds all but ~vocab x e^-30 of the probability.
constexpr float kChosenLogit = 30.0f;

// The roofline's efficiencies: `sim`'s where set, else its defaults.
models::sim::Efficiency EfficiencyOf(const SimConfig& sim) {
  models::sim::Efficiency eff;
  eff.memory = sim.memory_efficiency.value_or(eff.memory);
  eff.flops = sim.flops_efficiency.value_or(eff.flops);
  if (sim.host_us_per_seq.has_value()) {
    eff.host_s_per_seq = *sim.host_us_per_seq * 1e-6;
  }
  return eff;
}

uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

class SimBackend final : public ModelBackend {
 public:
  SimBackend(const SimConfig& sim, models::sim::Roofline roofline,
             std::string name, kvcache::KvDtype dtype, int32_t num_blocks,
             int32_t block_size, int64_t bytes_per_block, int32_t swap_slots,
             std::vector<uint8_t> excluded)
      : sim_(sim),
        roofline_(std::move(roofline)),
        name_(std::move(name)),
        dtype_(dtype),
        num_blocks_(num_blocks),
        block_size_(block_size),
        bytes_per_block_(bytes_per_block),
        swap_slots_(swap_slots),
        excluded_(std::move(excluded)),
        gpu_(*models::sim::FindGpu(sim.gpu)) {}

  std::string_view device_name() const override { return name_; }
  kvcache::KvDtype kv_dtype() const override { return dtype_; }
  int32_t num_blocks() const override { return num_blocks_; }
  int32_t block_size() const override { return block_size_; }
  int64_t bytes_per_block() const override { return bytes_per_block_; }
  int32_t num_swap_slots() const override { return swap_slots_; }
  double seconds_per_prefill_token() const override {
    constexpr int64_t kProbe = 2048;
    return roofline_.Prefill(kProbe).total_s / kProbe;
  }
  double swap_bytes_per_second() const override {
    return gpu_.host_link_bw * EfficiencyOf(sim_).memory;
  }

  absl::Status Forward(const models::ForwardBatch& batch,
                       models::ForwardOutput* out) override;
  absl::Status CopyBlocks(absl::Span<const BlockMove> moves) override {
    KV_RETURN_IF_ERROR(Check("CopyBlocks", moves, num_blocks_, num_blocks_));
    // Read and written once each.
    pending_s_ += 2.0 * static_cast<double>(moves.size()) * bytes_per_block_ /
                  (gpu_.memory_bw * EfficiencyOf(sim_).memory);
    return absl::OkStatus();
  }
  absl::Status SwapOut(absl::Span<const BlockMove> moves) override {
    KV_RETURN_IF_ERROR(Check("SwapOut", moves, num_blocks_, swap_slots_));
    pending_s_ += Transfer(moves.size());
    return absl::OkStatus();
  }
  absl::Status SwapIn(absl::Span<const BlockMove> moves) override {
    KV_RETURN_IF_ERROR(Check("SwapIn", moves, swap_slots_, num_blocks_));
    pending_s_ += Transfer(moves.size());
    return absl::OkStatus();
  }

 private:
  static absl::Status Check(const char* what, absl::Span<const BlockMove> m,
                            int32_t src_limit, int32_t dst_limit) {
    for (const BlockMove& b : m) {
      if (b.src < 0 || b.src >= src_limit || b.dst < 0 || b.dst >= dst_limit) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: move %d -> %d outside [0, %d) -> [0, %d)",
                            what, b.src, b.dst, src_limit, dst_limit));
      }
    }
    return absl::OkStatus();
  }
  double Transfer(size_t blocks) const {
    return static_cast<double>(blocks) * bytes_per_block_ /
           swap_bytes_per_second();
  }
  int32_t TokenFor(int32_t input_token, int32_t position) const;

  SimConfig sim_;
  models::sim::Roofline roofline_;
  std::string name_;
  kvcache::KvDtype dtype_;
  int32_t num_blocks_, block_size_;
  int64_t bytes_per_block_;
  int32_t swap_slots_;
  std::vector<uint8_t> excluded_;  // per id: 1 = never emitted
  models::sim::GpuSpec gpu_;
  double pending_s_ = 0;  // swaps and copies since the last forward
  std::vector<float> logits_;
};

int32_t SimBackend::TokenFor(int32_t input_token, int32_t position) const {
  const auto vocab = static_cast<uint64_t>(excluded_.size());
  uint64_t id = Mix(sim_.seed ^ Mix((uint64_t{uint32_t(input_token)} << 32) |
                                    uint32_t(position))) %
                vocab;
  // At least one id is allowed (CreateSimBackend checks).
  while (excluded_[id] != 0) id = (id + 1) % vocab;
  return static_cast<int32_t>(id);
}

absl::Status SimBackend::Forward(const models::ForwardBatch& batch,
                                 models::ForwardOutput* out) {
  const absl::Time start = absl::Now();
  const int32_t vocab = static_cast<int32_t>(excluded_.size());
  KV_RETURN_IF_ERROR(batch.Validate(num_blocks_, block_size_, vocab));
  const models::sim::StepLoad load = models::LoadOf(batch);
  const double step_s =
      (sim_.profile != nullptr ? sim_.profile->Seconds(load)
                               : roofline_.Step(load).total_s) +
      pending_s_;
  pending_s_ = 0;
  const size_t rows = batch.logits_rows.size();
  out->argmax.resize(rows);
  bool any_logits = false;
  for (size_t k = 0; k < rows; ++k) {
    const int32_t t = batch.logits_rows[k];
    out->argmax[k] = TokenFor(batch.token_ids[t], batch.positions[t]);
    any_logits |= batch.argmax_only.empty() || batch.argmax_only[k] == 0;
  }
  if (any_logits) {
    // Rows a sampler reads: one peaked distribution each.
    logits_.assign(rows * static_cast<size_t>(vocab), 0.0f);
    for (size_t k = 0; k < rows; ++k) {
      logits_[k * vocab + out->argmax[k]] = kChosenLogit;
    }
    out->logits = absl::MakeSpan(logits_);
  } else {
    out->logits = {};
  }
  if (sim_.step_sink) {
    sim_.step_sink(absl::Seconds(step_s));
  } else if (sim_.speed > 0) {
    absl::SleepFor(start + absl::Seconds(step_s / sim_.speed) - absl::Now());
  }
  return absl::OkStatus();
}

// Ids the simulation never emits: end of generation and control tokens.
std::vector<uint8_t> ExcludedIds(const models::Tokenizer& tok, int32_t vocab) {
  std::vector<uint8_t> ex(vocab, 0);
  for (int32_t id = 0; id < vocab; ++id) {
    ex[id] = tok.IsEog(id) || tok.IsSpecial(id) ? 1 : 0;
  }
  return ex;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBackend>> CreateSimBackend(
    const BackendConfig& config, LoadedModel* model) {
  if (model == nullptr || model->tokenizer == nullptr) {
    return absl::FailedPreconditionError(
        "--device=sim: the model's config and tokenizer are not loaded");
  }
  const models::ModelConfig& c = model->config;
  const SimConfig& sim = config.sim;
  std::string name = absl::StrCat("sim:", sim.gpu,
                                  sim.tp > 1 ? absl::StrCat("x", sim.tp) : "");
  KV_ASSIGN_OR_RETURN(const models::sim::GpuSpec gpu,
                      models::sim::FindGpu(sim.gpu));
  KV_ASSIGN_OR_RETURN(
      const kvcache::KvDtype dtype,
      PlatformFor(Device::kSim).ResolveKvDtype(config.kv_dtype, c.head_dim));
  const int64_t per_token =
      kvcache::KvBytesPerToken(models::KvShapeOf(c), dtype, sim.tp);
  const int64_t per_block = per_token * config.block_size;
  const double weight_bytes =
      sim.weight_bytes > 0 ? sim.weight_bytes : c.weight_dtype_bytes;
  const models::sim::MemoryBudget mem = models::sim::KvMemoryBudget(
      gpu, models::EstimateParameterCount(c), weight_bytes, sim.tp,
      1.0 - config.gpu_memory_fraction);
  const int64_t budget =
      config.kv_cache_bytes > 0 ? config.kv_cache_bytes : mem.kv_bytes;
  const int64_t blocks = std::min<int64_t>(budget / per_block, INT32_MAX / 2);
  if (blocks < 1) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--device %s: the weights (%.1f GB per rank at %g bytes a "
        "parameter) and the %.0f%% reserve leave no KV block on the %s's "
        "%.1f GB; use more ranks (sim:%sx%d), smaller weights "
        "(--sim-weight-bytes 1) or --kv-cache-bytes",
        name, mem.weight_bytes_per_rank / 1e9, weight_bytes,
        100 * (1.0 - config.gpu_memory_fraction), gpu.part, mem.hbm_bytes / 1e9,
        sim.gpu, sim.tp * 2));
  }
  const int64_t swap_slots = std::min<int64_t>(
      std::max<int64_t>(config.swap_space_bytes, 0) / per_block, INT32_MAX / 2);
  std::vector<uint8_t> excluded = ExcludedIds(*model->tokenizer, c.vocab_size);
  if (std::find(excluded.begin(), excluded.end(), 0) == excluded.end()) {
    return absl::FailedPreconditionError(
        "--device=sim: every token id is a control or end-of-generation id");
  }
  const models::sim::Efficiency eff = EfficiencyOf(sim);
  models::sim::Roofline roofline(c, gpu, sim.tp, weight_bytes, per_token, eff,
                                 dtype == kvcache::KvDtype::kFP8
                                     ? models::sim::AttentionUnits::kFp8
                                     : models::sim::AttentionUnits::kBf16);

  const std::string timing =
      sim.profile != nullptr
          ? std::string("from the measured step profile (--sim-profile)")
          : absl::StrFormat(
                "a roofline estimate at %.2f of the memory bandwidth and "
                "%.2f of the matrix rate, %g us of host time a sequence",
                eff.memory, eff.flops, eff.host_s_per_seq * 1e6);
  const std::string pace = sim.step_sink
                               ? std::string("in virtual time")
                               : absl::StrFormat("slept x1/%g", sim.speed);
  spdlog::warn(
      "SIMULATED device {} ({}): no weights loaded, token ids are seeded "
      "pseudo-random (seed {}), step times {}, {}",
      name, gpu.part, sim.seed, timing, pace);
  spdlog::info(
      "sim memory: {:.1f} GB - weights {:.1f} GB per rank - reserve {:.1f} "
      "GB = {:.1f} GB of KV: {} blocks of {} bytes",
      mem.hbm_bytes / 1e9, mem.weight_bytes_per_rank / 1e9,
      mem.reserve_bytes / 1e9, budget / 1e9, blocks, per_block);
  return std::make_unique<SimBackend>(
      sim, std::move(roofline), std::move(name), dtype,
      static_cast<int32_t>(blocks), config.block_size, per_block,
      static_cast<int32_t>(swap_slots), std::move(excluded));
}

}  // namespace kvserve::engine
