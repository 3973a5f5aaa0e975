#include "engine/runner/cuda_host_copier.h"

#ifdef KVSERVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "models/cuda/cuda_llama.h"
#include "models/cuda/cuda_status.h"
#include "models/cuda/kernels.h"
#include "spdlog/spdlog.h"
#ifdef KVSERVE_CUDA_EMU
// The SIMT emulator's hook (declared in tests/support/cuda_emu/state.h,
// which the product may not include): defers `stream`'s copies.
namespace kvserve::cuda_emu {
void DeferCopies(cudaStream_t stream);
}  // namespace kvserve::cuda_emu
#endif

namespace kvserve::engine {
namespace {

namespace mc = ::kvserve::models::cuda;

// Staging regions: a step's gathers take the next free ones, so copies of
// several steps may be in flight at once.
constexpr int kRegions = 4;
constexpr int64_t kStagingBytes = int64_t{64} << 20;

int32_t RegionBlocks(int64_t bytes_per_block, int32_t slots) {
  const int64_t per_region = kStagingBytes / kRegions / bytes_per_block;
  return static_cast<int32_t>(
      std::clamp<int64_t>(per_region, 1, std::max(slots, 1)));
}

class CudaHostCopier final : public HostKvCopier {
 public:
  CudaHostCopier(const mc::CudaKvCache* kv, int planes, int64_t block_bytes,
                 int32_t slots, cudaStream_t model)
      : kv_(kv),
        planes_(planes),
        block_bytes_(block_bytes),
        bytes_per_block_(planes * block_bytes),
        slots_(slots),
        region_blocks_(RegionBlocks(bytes_per_block_, slots)),
        model_(model) {}
  ~CudaHostCopier() override {
    (void)WaitAll();
    for (cudaEvent_t e : gathered_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
    if (mark_ != nullptr) (void)cudaEventDestroy(mark_);
    if (copy_ != nullptr) (void)cudaStreamDestroy(copy_);
  }

  absl::Status Init() {
    KV_RETURN_IF_ERROR(host_.Allocate(slots_ * bytes_per_block_,
                                      "--kv-host-cache-bytes slots"));
    KV_RETURN_IF_ERROR(staging_.Allocate(
        kRegions * region_blocks_ * bytes_per_block_, "host cache staging"));
    KV_RETURN_IF_ERROR(ids_host_.Allocate(kRegions * region_blocks_ * 4,
                                          "host cache block ids (host)"));
    KV_RETURN_IF_ERROR(
        ids_.Allocate(kRegions * region_blocks_ * 4, "host cache block ids"));
    KV_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
#ifdef KVSERVE_CUDA_EMU
    cuda_emu::DeferCopies(copy_);
#endif
    KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&mark_));
    for (cudaEvent_t& e : gathered_)
      KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    return absl::OkStatus();
  }

  int32_t num_slots() const override { return slots_; }
  int64_t slot_bytes() const override { return bytes_per_block_; }
  uint8_t* slot(int32_t s) const override {
    return host_.as<uint8_t>() + s * bytes_per_block_;
  }

  absl::StatusOr<Copy> CopyToHost(absl::Span<const Move> moves) override {
    KV_RETURN_IF_ERROR(Check(moves, /*to_host=*/true));
    const auto n = static_cast<int32_t>(moves.size());
    Copy c{last_ticket_, 0};
    auto* staging = staging_.as<uint8_t>();
    while (c.accepted < n) {
      const int r = next_region_;
      if (region_ticket_[r] != 0 && !CopyDone(region_ticket_[r])) break;
      const int32_t cn = std::min(region_blocks_, n - c.accepted);
      const int64_t first = int64_t{r} * region_blocks_;
      int32_t* ids = ids_host_.as<int32_t>() + first;
      for (int32_t i = 0; i < cn; ++i) ids[i] = moves[c.accepted + i].src;
      // The gather runs on the model stream, in order with the forwards
      // that wrote the blocks and before any later write to them.
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(ids_.as<int32_t>() + first, ids,
                                              cn * 4, cudaMemcpyHostToDevice,
                                              model_));
      KV_CUDA_RETURN_IF_ERROR(mc::StageKvBlocks(
          kv_->base, kv_->plane_bytes, planes_, block_bytes_,
          ids_.as<int32_t>() + first, cn, staging + first * bytes_per_block_,
          /*to_staging=*/true, model_));
      KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(gathered_[r], model_));
      KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, gathered_[r], 0));
      for (int32_t i = 0; i < cn; ++i) {
        KV_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(slot(moves[c.accepted + i].dst),
                            staging + (first + i) * bytes_per_block_,
                            bytes_per_block_, cudaMemcpyDeviceToHost, copy_));
      }
      KV_ASSIGN_OR_RETURN(region_ticket_[r], Record());
      c.ticket = region_ticket_[r];
      c.accepted += cn;
      next_region_ = (r + 1) % kRegions;
    }
    return c;
  }

  int32_t store_capacity() override {
    int32_t n = 0;
    for (int i = 0; i < kRegions; ++i) {
      const int r = (next_region_ + i) % kRegions;
      if (region_ticket_[r] != 0 && !CopyDone(region_ticket_[r])) break;
      n += region_blocks_;
    }
    return n;
  }

  absl::StatusOr<Copy> CopyFromHost(absl::Span<const Move> moves) override {
    KV_RETURN_IF_ERROR(Check(moves, /*to_host=*/false));
    if (moves.empty()) return Copy{last_ticket_, 0};
    // After everything the model stream was given so far (a gather may
    // still read a block that was since evicted and handed to this load).
    KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(mark_, model_));
    KV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_, mark_, 0));
    for (const Move& m : moves) {
      // One block of every plane: planes_ rows, plane_bytes apart.
      KV_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          static_cast<uint8_t*>(kv_->base) + m.dst * block_bytes_,
          kv_->plane_bytes, slot(m.src), block_bytes_, block_bytes_, planes_,
          cudaMemcpyHostToDevice, copy_));
    }
    KV_ASSIGN_OR_RETURN(const int64_t t, Record());
    return Copy{t, static_cast<int32_t>(moves.size())};
  }

  bool CopyDone(int64_t ticket) override {
    while (ticket > done_ticket_ && !inflight_.empty()) {
      const cudaError_t q = cudaEventQuery(inflight_.front().second);
      if (q == cudaErrorNotReady) return false;
      if (q != cudaSuccess) {
        spdlog::critical("CUDA host cache: a copy failed: {}",
                         cudaGetErrorString(q));
        spdlog::default_logger()->flush();
        std::abort();  // the device's state is unknown, as in Forward
      }
      done_ticket_ = inflight_.front().first;
      free_events_.push_back(inflight_.front().second);
      inflight_.pop_front();
    }
    return ticket <= done_ticket_;
  }

  absl::Status WaitAll() override {
    if (copy_ == nullptr) return absl::OkStatus();
    KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_));
    while (!CopyDone(last_ticket_)) {
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Check(absl::Span<const Move> moves, bool to_host) const {
    for (const Move& m : moves) {
      const int32_t block = to_host ? m.src : m.dst;
      const int32_t s = to_host ? m.dst : m.src;
      if (block < 0 || block >= kv_->num_blocks || s < 0 || s >= slots_) {
        return absl::InvalidArgumentError(
            absl::StrCat(to_host ? "CopyToHost" : "CopyFromHost", ": block ",
                         block, " / host slot ", s, " outside [0, ",
                         kv_->num_blocks, ") / [0, ", slots_, ")"));
      }
    }
    return absl::OkStatus();
  }

  // An event after the copy stream's work so far: the next ticket.
  absl::StatusOr<int64_t> Record() {
    cudaEvent_t e = nullptr;
    if (free_events_.empty()) {
      KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    } else {
      e = free_events_.back();
      free_events_.pop_back();
    }
    KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, copy_));
    inflight_.emplace_back(++last_ticket_, e);
    return last_ticket_;
  }

  const mc::CudaKvCache* const kv_;
  const int planes_;
  const int64_t block_bytes_;      // one plane's block
  const int64_t bytes_per_block_;  // a slot
  const int32_t slots_;
  const int32_t region_blocks_;
  cudaStream_t const model_;
  cudaStream_t copy_ = nullptr;
  mc::PinnedBuffer host_;
  mc::DeviceBuffer staging_;
  mc::PinnedBuffer ids_host_;
  mc::DeviceBuffer ids_;
  cudaEvent_t mark_ = nullptr;
  cudaEvent_t gathered_[kRegions] = {};
  int64_t region_ticket_[kRegions] = {};
  int next_region_ = 0;
  int64_t last_ticket_ = 0, done_ticket_ = 0;
  std::deque<std::pair<int64_t, cudaEvent_t>> inflight_;
  std::vector<cudaEvent_t> free_events_;
};

}  // namespace

int64_t CudaHostCopierStagingBytes(int64_t bytes_per_block, int32_t slots) {
  return kRegions * int64_t{RegionBlocks(bytes_per_block, slots)} *
         bytes_per_block;
}

absl::StatusOr<std::unique_ptr<HostKvCopier>> CreateCudaHostCopier(
    const mc::CudaKvCache* kv, int num_planes, int64_t block_bytes,
    int32_t slots, void* model_stream) {
  auto c =
      std::make_unique<CudaHostCopier>(kv, num_planes, block_bytes, slots,
                                       static_cast<cudaStream_t>(model_stream));
  KV_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<HostKvCopier>(std::move(c));
}

}  // namespace kvserve::engine

#endif  // KVSERVE_CUDA
