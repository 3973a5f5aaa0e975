#include "engine/runner/cuda_backend.h"

#ifdef KVSERVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "engine/runner/cuda_host_copier.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/platform.h"
#include "kvcache/kv_sizing.h"
#include "models/cpu/cpu_llama_model.h"  // the CPU copy a load may hold
#include "models/cuda/cuda_llama.h"
#include "models/cuda/cuda_status.h"
#include "models/loader/model_files.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

namespace mc = ::kvserve::models::cuda;

// A ForwardBatch of one sequence of `n` prompt tokens in blocks 0.. of a
// cache of `block_size`, asking for the last `rows` logits rows.
models::ForwardBatch ProfileBatch(int32_t n, int32_t rows, int32_t block_size,
                                  int32_t vocab) {
  models::ForwardBatch b;
  const int32_t blocks = (n + block_size - 1) / block_size;
  for (int32_t i = 0; i < n; ++i) {
    b.token_ids.push_back(i % vocab);
    b.positions.push_back(i);
    b.slot_mapping.push_back(i);
  }
  b.seq_starts = {0, n};
  b.context_lens = {n};
  b.max_blocks_per_seq = blocks;
  for (int32_t i = 0; i < blocks; ++i) b.block_tables.push_back(i);
  for (int32_t r = std::max(0, n - rows); r < n; ++r)
    b.logits_rows.push_back(r);
  return b;
}

// The kernels' element type of a dtype the CUDA platform resolved (bf16,
// fp8 e4m3, or int8 q8_0: a fp16 scale per 32 values).
mc::KvElem CudaKvElem(kvcache::KvDtype dtype) {
  switch (dtype) {
    case kvcache::KvDtype::kFP8:
      return mc::KvElem::kFp8E4M3;
    case kvcache::KvDtype::kInt8:
      return mc::KvElem::kInt8;
    default:
      return mc::KvElem::kBf16;
  }
}

// int8 pages need every block to start 16-byte aligned (block copy, swap
// staging and the attention's 8-byte chunk loads): block_size * kv_heads *
// head_dim a multiple of 256, true for every block size that is a multiple
// of 4 (head_dim is 64 or 128); and one token's K and V rows staged in
// shared memory by reshape-and-cache (at most 48 KiB). Other head_dims pass
// here: CudaLlamaModel::Create refuses them, naming the head_dim.
absl::Status CheckInt8Shape(const models::ModelConfig& c, int32_t block_size) {
  if (c.head_dim != 64 && c.head_dim != 128) return absl::OkStatus();
  const int64_t values =
      static_cast<int64_t>(block_size) * c.num_kv_heads * c.head_dim;
  if (values % 256 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-dtype int8 on --device cuda: --block-size ", block_size,
        " x ", c.num_kv_heads, " KV heads x head_dim ", c.head_dim,
        " is not a multiple of 256 values (int8 blocks must start 16-byte "
        "aligned); use a --block-size that is a multiple of 4"));
  }
  if (c.head_dim % kvcache::kKvQuantGroup != 0 ||
      (2LL * c.num_kv_heads + 1) * c.head_dim * 4 > 48 * 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-dtype int8 on --device cuda: ", c.num_kv_heads,
        " KV heads of head_dim ", c.head_dim,
        " are not supported (head_dim must be a multiple of 32, and "
        "(2 x KV heads + 1) x head_dim floats fit in 48 KiB); use bf16 or "
        "fp8"));
  }
  return absl::OkStatus();
}

class CudaBackend final : public ModelBackend {
 public:
  static absl::StatusOr<std::unique_ptr<ModelBackend>> Create(
      const BackendConfig& config, LoadedModel* model);
  std::string_view device_name() const override { return device_name_; }
  bool ScoresKvSinks() const override { return false; }
  kvcache::KvDtype kv_dtype() const override {
    switch (kv_.elem) {
      case mc::KvElem::kFp8E4M3:
        return kvcache::KvDtype::kFP8;
      case mc::KvElem::kInt8:
        return kvcache::KvDtype::kInt8;
      case mc::KvElem::kBf16:
        break;
    }
    return kvcache::KvDtype::kBF16;
  }
  int32_t num_blocks() const override { return kv_.num_blocks; }
  int32_t block_size() const override { return kv_.block_size; }
  int64_t bytes_per_block() const override { return bytes_per_block_; }
  int32_t num_swap_slots() const override { return num_swap_slots_; }
  double seconds_per_prefill_token() const override {
    return seconds_per_prefill_token_;
  }
  double swap_bytes_per_second() const override { return swap_bps_; }

  absl::Status Forward(const models::ForwardBatch& batch,
                       models::ForwardOutput* out) override {
    ++step_;
    absl::Status st = model_->Forward(batch, kv_, out);
    if (!st.ok() && st.code() != absl::StatusCode::kInvalidArgument) {
      Fatal("Forward", st, &batch);
    }
    return st;
  }
  absl::Status CopyBlocks(absl::Span<const BlockMove> moves) override;
  absl::Status SwapOut(absl::Span<const BlockMove> moves) override {
    return Swap(moves, /*out=*/true);
  }
  absl::Status SwapIn(absl::Span<const BlockMove> moves) override {
    return Swap(moves, /*out=*/false);
  }
  HostKvCopier* host_kv_copier() const override { return host_cache_.get(); }
  // The KV tiers' keys: the bytes a block holds are the kernels' (bf16,
  // e4m3, q8_0 values then scales), per layer its K then its V block.
  std::string kv_numerics_version() const override { return "cuda-kv-1"; }
  std::string kv_layout_version() const override { return "cuda-planes-1"; }

 private:
  CudaBackend() = default;
  absl::Status Profile(const BackendConfig& config);
  absl::Status AllocateKv(const BackendConfig& config);
  absl::Status AllocateSwap(const BackendConfig& config);
  absl::Status AllocateHostCache(const BackendConfig& config);
  absl::Status Swap(absl::Span<const BlockMove> moves, bool out);
  // Makes pairs_ / pairs_host_ hold at least `pairs` int pairs.
  absl::Status ReservePairs(int64_t pairs);
  // A CUDA failure after start-up: the device state is unknown, so log the
  // step and its batch shape (the step plan), then abort.
  [[noreturn]] void Fatal(const char* what, const absl::Status& st,
                          const models::ForwardBatch* batch) const;

  std::string device_name_ = "cuda:0";
  std::unique_ptr<mc::CudaLlamaModel> model_;
  mc::DeviceBuffer kv_buffer_;
  mc::CudaKvCache kv_;
  int64_t bytes_per_block_ = 0;  // all layers, K and V
  int64_t block_bytes_ = 0;      // one plane
  int32_t num_swap_slots_ = 0;
  mc::PinnedBuffer swap_host_;  // num_swap_slots_ blocks
  double seconds_per_prefill_token_ = 1e-4;
  double swap_bps_ = 25e9;
  int64_t step_ = 0;
  // Block ids / copy pairs for the copy kernels: pinned host and device.
  mc::DeviceBuffer pairs_;
  mc::PinnedBuffer pairs_host_;
  int64_t pairs_cap_ = 0;  // int pairs
  // Swap staging: staging_blocks_ whole blocks, each laid out like a host
  // swap slot, so that a block crosses PCIe in one copy (not 2 x layers).
  mc::DeviceBuffer staging_;
  int64_t staging_blocks_ = 0;
  // Last: its copies end before the KV and the stream go.
  std::unique_ptr<HostKvCopier> host_cache_;
};

void CudaBackend::Fatal(const char* what, const absl::Status& st,
                        const models::ForwardBatch* batch) const {
  std::string plan = "(no batch)";
  if (batch != nullptr) {
    plan = absl::StrCat(batch->num_tokens(), " tokens, ", batch->num_seqs(),
                        " sequences, context_lens [",
                        absl::StrJoin(batch->context_lens, ","),
                        "], logits rows ", batch->logits_rows.size());
  }
  spdlog::critical("CUDA backend: {} failed at step {}: {}; step plan: {}",
                   what, step_, st.ToString(), plan);
  spdlog::default_logger()->flush();
  std::abort();
}

absl::Status CudaBackend::Profile(const BackendConfig& config) {
  const models::ModelConfig& c = model_->config();
  const int32_t n = std::max(1, config.max_num_batched_tokens);
  const int32_t rows = std::clamp(config.max_num_seqs, 1, n);
  KV_RETURN_IF_ERROR(model_->Reserve(std::max(n, config.max_num_seqs), rows));
  const int32_t blocks = (n + config.block_size - 1) / config.block_size;
  mc::DeviceBuffer tmp;
  KV_RETURN_IF_ERROR(
      tmp.Allocate(2LL * c.num_layers * blocks * block_bytes_, "profiling KV"));
  mc::CudaKvCache kv{blocks, config.block_size, tmp.as<void>(),
                     blocks * block_bytes_, kv_.elem};
  const models::ForwardBatch b =
      ProfileBatch(n, rows, config.block_size, c.vocab_size);
  models::ForwardOutput out;
#ifndef KVSERVE_CUDA_EMU
  // Warm-up (module loading, cuBLAS's first call). The SIMT emulator has
  // none, and its timing only says how fast the CPU emulates: the one
  // forward there still runs the largest step's shapes.
  KV_RETURN_IF_ERROR(model_->Forward(b, kv, &out));
#endif
  const auto t0 = std::chrono::steady_clock::now();
  KV_RETURN_IF_ERROR(model_->Forward(b, kv, &out));
  const double secs = SecondsSince(t0);
  seconds_per_prefill_token_ = secs / n;
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateKv(const BackendConfig& config) {
  // The swap staging buffer first, so that the KV budget below counts it.
  const int64_t slots = config.swap_space_bytes / bytes_per_block_;
  if (slots > 0) {
    staging_blocks_ =
        std::clamp<int64_t>((64LL << 20) / bytes_per_block_, 1, slots);
    KV_RETURN_IF_ERROR(
        staging_.Allocate(staging_blocks_ * bytes_per_block_, "swap staging"));
  }
  size_t free_b = 0, total_b = 0;
  KV_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
  const int64_t free_bytes = static_cast<int64_t>(free_b);
  const int64_t total = static_cast<int64_t>(total_b);
  int64_t budget = 0;
  if (config.kv_cache_bytes > 0) {
    budget = config.kv_cache_bytes;
    if (budget > free_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--kv-cache-bytes=", budget, ": only ", free_bytes,
                       " bytes of device memory are free after the weights (",
                       model_->weight_bytes(), " bytes)"));
    }
  } else {
    if (config.gpu_memory_fraction <= 0.0 || config.gpu_memory_fraction > 1.0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu-memory-fraction must be in (0, 1], got ",
                       config.gpu_memory_fraction));
    }
    budget = static_cast<int64_t>(config.gpu_memory_fraction *
                                  static_cast<double>(total)) -
             (total - free_bytes);
  }
  const int64_t blocks = budget / bytes_per_block_;
  if (blocks < 1) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--gpu-memory-fraction=", config.gpu_memory_fraction,
        " leaves no room for one KV block (", bytes_per_block_,
        " bytes) after the weights (", model_->weight_bytes(),
        " bytes) and activations: ", free_bytes, " of ", total,
        " bytes free; raise the fraction or set --kv-cache-bytes"));
  }
  const int32_t nb = static_cast<int32_t>(std::min<int64_t>(blocks, 1 << 30));
  KV_RETURN_IF_ERROR(kv_buffer_.Allocate(nb * bytes_per_block_, "KV blocks"));
  kv_ = mc::CudaKvCache{nb, config.block_size, kv_buffer_.as<void>(),
                        nb * block_bytes_, kv_.elem};
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateSwap(const BackendConfig& config) {
  num_swap_slots_ = static_cast<int32_t>(
      std::min<int64_t>(config.swap_space_bytes / bytes_per_block_, 1 << 30));
  if (num_swap_slots_ <= 0) {
    num_swap_slots_ = 0;
    return absl::OkStatus();
  }
  KV_RETURN_IF_ERROR(swap_host_.Allocate(num_swap_slots_ * bytes_per_block_,
                                         "host swap space"));
  // Measure device -> pinned host bandwidth once (up to 64 MiB).
  const int64_t bytes = std::min<int64_t>(
      {64LL << 20, num_swap_slots_ * bytes_per_block_,
       static_cast<int64_t>(kv_.num_blocks) * bytes_per_block_});
  const auto t0 = std::chrono::steady_clock::now();
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(swap_host_.as<void>(), kv_.base,
                                          bytes, cudaMemcpyDeviceToHost,
                                          model_->stream()));
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(model_->stream()));
  const double secs = SecondsSince(t0);
  if (secs > 0) swap_bps_ = static_cast<double>(bytes) / secs;
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateHostCache(const BackendConfig& config) {
  if (config.host_cache_bytes <= 0) return absl::OkStatus();
  const int64_t slots = config.host_cache_bytes / bytes_per_block_;
  if (slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-host-cache-bytes=", config.host_cache_bytes,
        " is less than one KV block (", bytes_per_block_, " bytes)"));
  }
  // Before the KV blocks: the budget from free memory then counts the
  // staging; the copier reads kv_ when it copies.
  KV_ASSIGN_OR_RETURN(
      host_cache_, CreateCudaHostCopier(
                       &kv_, 2 * model_->config().num_layers, block_bytes_,
                       static_cast<int32_t>(std::min<int64_t>(slots, 1 << 30)),
                       model_->stream()));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelBackend>> CudaBackend::Create(
    const BackendConfig& config, LoadedModel* model) {
  KV_ASSIGN_OR_RETURN(
      const kvcache::KvDtype dtype,
      PlatformFor(Device::kCuda)
          .ResolveKvDtype(config.kv_dtype, model->config.head_dim));
  const mc::KvElem elem = CudaKvElem(dtype);
  // LoadModel(..., Device::kCuda) keeps the weights; a model loaded for the CPU
  // is re-opened from its path (the packed CPU copy is then dropped).
  std::unique_ptr<models::WeightSource> weights = std::move(model->weights);
  if (weights == nullptr) {
    KV_ASSIGN_OR_RETURN(models::ModelFiles files,
                        models::OpenModelFiles(model->path));
    weights = std::move(files.weights);
    model->model.reset();
  }
  if (config.block_size <= 0 || config.block_size > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--block-size must be in [1, 1024], got ", config.block_size));
  }
  if (elem == mc::KvElem::kInt8) {
    KV_RETURN_IF_ERROR(CheckInt8Shape(model->config, config.block_size));
  }
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  cudaDeviceProp prop{};
  KV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->kv_.elem = elem;
  KV_ASSIGN_OR_RETURN(b->model_,
                      mc::CudaLlamaModel::Create(model->config, *weights));
  weights.reset();  // the host copy is no longer needed
  b->block_bytes_ = b->model_->BlockBytes(config.block_size, elem);
  b->bytes_per_block_ = 2LL * model->config.num_layers * b->block_bytes_;
  KV_RETURN_IF_ERROR(b->Profile(config));
  KV_RETURN_IF_ERROR(b->AllocateHostCache(config));
  KV_RETURN_IF_ERROR(b->AllocateKv(config));
  KV_RETURN_IF_ERROR(b->AllocateSwap(config));
  spdlog::info(
      "CUDA backend on {} ({} SMs): weights {:.2f} GiB bf16, {} KV blocks of "
      "{} tokens ({:.2f} GiB {}), {} swap slots, {} host cache slots, "
      "prefill {:.1f} us/token",
      prop.name, prop.multiProcessorCount,
      b->model_->weight_bytes() / 1073741824.0, b->kv_.num_blocks,
      config.block_size,
      b->kv_.num_blocks * static_cast<double>(b->bytes_per_block_) /
          1073741824.0,
      kvcache::KvDtypeName(b->kv_dtype()), b->num_swap_slots_,
      b->host_cache_ ? b->host_cache_->num_slots() : 0,
      b->seconds_per_prefill_token_ * 1e6);
  return std::unique_ptr<ModelBackend>(std::move(b));
}

absl::Status CudaBackend::CopyBlocks(absl::Span<const BlockMove> moves) {
  if (moves.empty()) return absl::OkStatus();
  for (const BlockMove& m : moves) {
    if (m.src < 0 || m.src >= kv_.num_blocks || m.dst < 0 ||
        m.dst >= kv_.num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("CopyBlocks: block ", m.src, " -> ", m.dst,
                       " outside [0, ", kv_.num_blocks, ")"));
    }
  }
  const int64_t n = static_cast<int64_t>(moves.size());
  auto run = [&]() -> absl::Status {
    KV_RETURN_IF_ERROR(ReservePairs(n));
    int32_t* pairs = pairs_host_.as<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      pairs[2 * i] = moves[i].src;
      pairs[2 * i + 1] = moves[i].dst;
    }
    cudaStream_t s = model_->stream();
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pairs_.as<int32_t>(), pairs, n * 8,
                                            cudaMemcpyHostToDevice, s));
    KV_CUDA_RETURN_IF_ERROR(mc::CopyKvBlocks(
        kv_.base, kv_.plane_bytes, 2 * model_->config().num_layers,
        block_bytes_, pairs_.as<int32_t>(), static_cast<int>(n), s));
    KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return absl::OkStatus();
  };
  absl::Status st = run();
  if (!st.ok()) Fatal("CopyBlocks", st, nullptr);
  return st;
}

absl::Status CudaBackend::ReservePairs(int64_t pairs) {
  if (pairs <= pairs_cap_) return absl::OkStatus();
  pairs_cap_ = 0;
  KV_RETURN_IF_ERROR(
      pairs_host_.Allocate(pairs * 8, "block copy pairs (host)"));
  KV_RETURN_IF_ERROR(pairs_.Allocate(pairs * 8, "block copy pairs"));
  pairs_cap_ = pairs;
  return absl::OkStatus();
}

absl::Status CudaBackend::Swap(absl::Span<const BlockMove> moves, bool out) {
  if (moves.empty()) return absl::OkStatus();
  for (const BlockMove& m : moves) {
    const int32_t block = out ? m.src : m.dst;
    const int32_t slot = out ? m.dst : m.src;
    if (block < 0 || block >= kv_.num_blocks || slot < 0 ||
        slot >= num_swap_slots_) {
      return absl::InvalidArgumentError(absl::StrCat(
          out ? "SwapOut" : "SwapIn", ": block ", block, " / swap slot ", slot,
          " outside [0, ", kv_.num_blocks, ") / [0, ", num_swap_slots_, ")"));
    }
  }
  // Chunks of staging_blocks_: swap in copies each slot to staging, then
  // scatters; swap out gathers, then copies each block to its slot. One
  // stream orders the reuse of staging between chunks.
  auto run = [&]() -> absl::Status {
    cudaStream_t s = model_->stream();
    const int planes = 2 * model_->config().num_layers;
    const int64_t n = static_cast<int64_t>(moves.size());
    KV_RETURN_IF_ERROR(ReservePairs(n));
    int32_t* blocks = pairs_host_.as<int32_t>();
    for (int64_t i = 0; i < n; ++i)
      blocks[i] = out ? moves[i].src : moves[i].dst;
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(pairs_.as<int32_t>(), blocks, n * 4,
                                            cudaMemcpyHostToDevice, s));
    auto* staging = staging_.as<uint8_t>();
    auto* host = swap_host_.as<uint8_t>();
    for (int64_t c0 = 0; c0 < n; c0 += staging_blocks_) {
      const int64_t cn = std::min(staging_blocks_, n - c0);
      for (int64_t i = 0; !out && i < cn; ++i) {
        KV_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(staging + i * bytes_per_block_,
                            host + moves[c0 + i].src * bytes_per_block_,
                            bytes_per_block_, cudaMemcpyHostToDevice, s));
      }
      KV_CUDA_RETURN_IF_ERROR(
          mc::StageKvBlocks(kv_.base, kv_.plane_bytes, planes, block_bytes_,
                            pairs_.as<int32_t>() + c0, static_cast<int>(cn),
                            staging_.as<void>(), out, s));
      for (int64_t i = 0; out && i < cn; ++i) {
        KV_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(host + moves[c0 + i].dst * bytes_per_block_,
                            staging + i * bytes_per_block_, bytes_per_block_,
                            cudaMemcpyDeviceToHost, s));
      }
    }
    KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return absl::OkStatus();
  };
  absl::Status st = run();
  if (!st.ok()) Fatal(out ? "SwapOut" : "SwapIn", st, nullptr);
  return st;
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<ModelBackend>> CreateCudaBackend(
    const BackendConfig& config, LoadedModel* model) {
  return CudaBackend::Create(config, model);
}

}  // namespace kvserve::engine

#endif  // KVSERVE_CUDA
