// The CPU backend. Owns the packed CpuLlamaModel (moved out of LoadedModel),
// the KV blocks in the configured dtype (KvCacheStorage) and a host swap
// area of whole blocks. A swap slot holds one block of every layer, K then V
// per layer, laid out contiguously: [layer][K|V][block_size * kv_heads rows].
//
// Cost model inputs, measured once at start-up:
//   seconds_per_prefill_token: the faster of two timed forwards of
//     kProbeTokens prompt tokens written into the first blocks of the (still
//     empty) pool. A short probe
//     overestimates the per-token cost of long chunks a little (matmuls get
//     more efficient with more rows), which biases the choice towards swap
//     when both are close; the blocks are zeroed again afterwards.
//   swap_bytes_per_second: a timed memcpy of one block (or 8 MiB, whichever
//     is larger) between two host buffers, after a warm-up copy.
#include "engine/runner/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/page_buffer.h"
#include "common/status_macros.h"
#include "common/system.h"
#include "engine/runner/kv_cache_storage.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/platform.h"
#include "kvcache/kv_sizing.h"
#include "models/cpu/cpu_llama_model.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

constexpr int32_t kProbeTokens = 32;

}  // namespace

kvcache::KvDtype DefaultCpuKvDtype(int head_dim) {
  return kvcache::KvRotationFor(kvcache::KvDtype::kInt8, head_dim).k > 0
             ? kvcache::KvDtype::kInt8
             : kvcache::KvDtype::kF16;
}

namespace {

class CpuBackend final : public ModelBackend {
 public:
  CpuBackend(std::unique_ptr<models::CpuLlamaModel> model,
             std::unique_ptr<KvCacheStorage> kv)
      : model_(std::move(model)), kv_(std::move(kv)) {}

  absl::Status Init(int64_t swap_space_bytes);

  std::string_view device_name() const override { return "cpu"; }
  kvcache::KvDtype kv_dtype() const override { return kv_->dtype(); }
  int32_t num_blocks() const override { return kv_->num_blocks(); }
  int32_t block_size() const override { return kv_->block_size(); }
  int64_t bytes_per_block() const override { return kv_->bytes_per_block(); }
  int32_t num_swap_slots() const override { return num_swap_slots_; }
  double seconds_per_prefill_token() const override {
    return seconds_per_token_;
  }
  double swap_bytes_per_second() const override { return swap_bps_; }

  bool ReportsBlockMass() const override { return true; }
  // The logits are already in host memory: no device argmax.
  absl::Status Forward(const models::ForwardBatch& batch,
                       models::ForwardOutput* out) override {
    out->argmax.clear();
    const int64_t rebuilt = model_->residual(kv_->view()).rebuilt_groups();
    absl::Status st = model_->Forward(batch, kv_->view(), &logits_);
    out->logits = absl::MakeSpan(logits_);
    out->block_mass = model_->block_mass();
    out->kv_groups_rebuilt =
        model_->residual(kv_->view()).rebuilt_groups() - rebuilt;
    return st;
  }
  absl::Status CopyBlocks(absl::Span<const BlockMove> moves) override;
  absl::Status SwapOut(absl::Span<const BlockMove> moves) override;
  absl::Status SwapIn(absl::Span<const BlockMove> moves) override;
  std::vector<kvtier::Piece> KvBlockPieces(int32_t block) const override;
  // NOTE: bump when a kernel change alters the KV bytes a forward stores:
  // the disk tier's old blocks then miss instead of serving stale numerics.
  std::string kv_numerics_version() const override { return "cpu-n1"; }
  std::string kv_layout_version() const override {
    return "cpu-layer-kv-rows-v1";
  }

 private:
  // A swap slot: one block of every layer, K then V per layer.
  std::byte* Slot(int32_t slot) {
    return reinterpret_cast<std::byte*>(swap_.data()) +
           static_cast<int64_t>(slot) * kv_->bytes_per_block();
  }
  absl::Status CheckBlock(const char* what, int32_t id, int32_t limit) const;
  void MeasureCosts();
  // int3/int2: the model keeps exact keys of partly filled key groups.
  bool KeyGroups() const { return kvcache::KvLowBits(kv_->dtype()) > 0; }

  std::unique_ptr<models::CpuLlamaModel> model_;
  std::unique_ptr<KvCacheStorage> kv_;
  PageBuffer swap_;  // num_swap_slots_ blocks, committed as they are used
  std::vector<float> logits_;  // what Forward's output points to
  int32_t num_swap_slots_ = 0;
  double seconds_per_token_ = 1e-3;
  double swap_bps_ = 1e9;
};

absl::Status CpuBackend::Init(int64_t swap_space_bytes) {
  const int64_t slots = std::min<int64_t>(
      std::max<int64_t>(swap_space_bytes, 0) / kv_->bytes_per_block(),
      INT32_MAX / 2);
  if (slots > 0) {
    KV_ASSIGN_OR_RETURN(
        swap_, PageBuffer::Reserve(slots * kv_->bytes_per_block(),
                                   "--swap-space-bytes (host swap space)"));
  }
  num_swap_slots_ = static_cast<int32_t>(slots);
  MeasureCosts();
  spdlog::info(
      "cpu kv: {:.1f} MiB of KV blocks and {:.1f} MiB of swap space reserved; "
      "memory is committed as blocks are first written ({:.1f} MiB now)",
      kv_->total_bytes() / 1048576.0, swap_.size() / 1048576.0,
      (kv_->ResidentBytes() + swap_.ResidentBytes()) / 1048576.0);
  return absl::OkStatus();
}

void CpuBackend::MeasureCosts() {
  // Prefill probe over the first blocks of the empty pool.
  const int32_t bs = kv_->block_size();
  const int32_t tokens = std::min(kProbeTokens, kv_->num_blocks() * bs);
  models::ForwardBatch b;
  for (int32_t t = 0; t < tokens; ++t) {
    b.token_ids.push_back(t % 64 + 1);
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
  }
  const int32_t blocks = (tokens + bs - 1) / bs;
  b.seq_starts = {0, tokens};
  b.context_lens = {tokens};
  b.max_blocks_per_seq = blocks;
  for (int32_t i = 0; i < blocks; ++i) b.block_tables.push_back(i);
  b.logits_rows = {tokens - 1};
  std::vector<float> logits;
  // Twice, keeping the faster: the first call also pays one-time set-up
  // (scratch buffers, thread pool start).
  for (int i = 0; i < 2 && tokens > 0; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!model_->Forward(b, kv_->view(), &logits).ok()) break;
    const double s = std::max(SecondsSince(t0) / tokens, 1e-7);
    seconds_per_token_ = i == 0 ? s : std::min(seconds_per_token_, s);
  }
  // Leave the probed blocks as a fresh pool has them: zeros, not resident.
  kv_->ZeroBlocks(0, blocks);
  // Host copy bandwidth.
  const int64_t bytes =
      std::max<int64_t>(kv_->bytes_per_block(), int64_t{8} << 20);
  std::vector<char> a(bytes, 1), c(bytes, 0);
  std::memcpy(c.data(), a.data(), bytes);  // warm-up: fault the pages in
  const auto t1 = std::chrono::steady_clock::now();
  std::memcpy(c.data(), a.data(), bytes);
  const double s = SecondsSince(t1);
  if (s > 0) swap_bps_ = bytes / s;
}

absl::Status CpuBackend::CheckBlock(const char* what, int32_t id,
                                    int32_t limit) const {
  if (id < 0 || id >= limit) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s %d outside [0, %d)", what, id, limit));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyBlocks(absl::Span<const BlockMove> moves) {
  for (const BlockMove& m : moves) {
    KV_RETURN_IF_ERROR(
        CheckBlock("CopyBlocks: src block", m.src, num_blocks()));
    KV_RETURN_IF_ERROR(
        CheckBlock("CopyBlocks: dst block", m.dst, num_blocks()));
    kv_->CopyBlock(m.src, m.dst);
    if (KeyGroups()) {
      model_->residual(kv_->view()).Copy(m.src, m.dst, kv_->block_size());
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::SwapOut(absl::Span<const BlockMove> moves) {
  const models::KvCacheView& v = kv_->view();
  const int64_t n = v.BlockBytes();
  for (const BlockMove& m : moves) {
    KV_RETURN_IF_ERROR(CheckBlock("SwapOut: src block", m.src, num_blocks()));
    KV_RETURN_IF_ERROR(CheckBlock("SwapOut: dst slot", m.dst, num_swap_slots_));
    std::byte* dst = Slot(m.dst);
    for (size_t l = 0; l < v.k.size(); ++l) {
      std::memcpy(dst + (2 * l) * n, v.k[l] + m.src * n, n);
      std::memcpy(dst + (2 * l + 1) * n, v.v[l] + m.src * n, n);
    }
  }
  return absl::OkStatus();
}

std::vector<kvtier::Piece> CpuBackend::KvBlockPieces(int32_t block) const {
  if (block < 0 || block >= num_blocks()) return {};
  const models::KvCacheView& v = kv_->view();
  const int64_t n = v.BlockBytes();
  std::vector<kvtier::Piece> pieces;
  pieces.reserve(2 * v.k.size());
  for (size_t l = 0; l < v.k.size(); ++l) {
    pieces.push_back({reinterpret_cast<uint8_t*>(v.k[l] + block * n),
                      static_cast<size_t>(n)});
    pieces.push_back({reinterpret_cast<uint8_t*>(v.v[l] + block * n),
                      static_cast<size_t>(n)});
  }
  return pieces;
}

absl::Status CpuBackend::SwapIn(absl::Span<const BlockMove> moves) {
  const models::KvCacheView& v = kv_->view();
  const int64_t n = v.BlockBytes();
  for (const BlockMove& m : moves) {
    KV_RETURN_IF_ERROR(CheckBlock("SwapIn: src slot", m.src, num_swap_slots_));
    KV_RETURN_IF_ERROR(CheckBlock("SwapIn: dst block", m.dst, num_blocks()));
    const std::byte* src = Slot(m.src);
    for (size_t l = 0; l < v.k.size(); ++l) {
      std::memcpy(v.k[l] + m.dst * n, src + (2 * l) * n, n);
      std::memcpy(v.v[l] + m.dst * n, src + (2 * l + 1) * n, n);
    }
    if (KeyGroups())
      model_->residual(kv_->view()).Forget(m.dst, kv_->block_size());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBackend>> CreateCpuBackend(
    const BackendConfig& config, LoadedModel* model) {
  if (model == nullptr || model->model == nullptr) {
    return absl::FailedPreconditionError(
        "--device=cpu: the packed CPU model is not loaded (the model was "
        "loaded for another device; load it with LoadModel(path, "
        "Device::kCpu))");
  }
  const models::ModelConfig& c = model->config;
  int64_t budget = config.kv_cache_bytes;
  if (budget <= 0) {
    budget =
        static_cast<int64_t>(PhysicalMemoryBytes() * config.kv_cache_fraction);
  }
  KV_ASSIGN_OR_RETURN(
      const kvcache::KvDtype dtype,
      PlatformFor(Device::kCpu).ResolveKvDtype(config.kv_dtype, c.head_dim));
  KV_RETURN_IF_ERROR(kvcache::CheckKvDtypeBlockSize(dtype, config.block_size));
  KV_ASSIGN_OR_RETURN(
      auto kv, KvCacheStorage::Create({c.num_layers, c.num_kv_heads, c.head_dim,
                                       config.block_size, 0, budget, dtype}));
  auto backend =
      std::make_unique<CpuBackend>(std::move(model->model), std::move(kv));
  KV_RETURN_IF_ERROR(backend->Init(config.swap_space_bytes));
  return backend;
}

}  // namespace kvserve::engine
