// ComputePool: the worker threads behind kvserve::ParallelFor (parallel.h).
// It owns NumThreads() - 1 workers; the calling thread works too. A job is
// `chunks` independent calls fn(ctx, c), c in [0, chunks), that every
// participating thread claims one at a time from a shared counter, so a
// worker that is late (descheduled, still waking up) only takes fewer
// chunks instead of stalling the job, as a static split's barrier would.
//
// Waiting: a worker spins for `spin` after its last job (a forward pass
// dispatches jobs microseconds apart), then parks on a futex until the next
// one. The caller, once no chunk is left to claim, waits for the chunks
// still running and yields its core while it does, so on an oversubscribed
// machine the worker holding a chunk can run.
//
// Invariants: one job at a time (a mutex); a worker only runs a chunk it
// claimed with a compare-and-swap on the packed (job, next, chunks) word,
// so a straggler from a finished job can never claim a chunk of the next
// one; the caller returns only after every chunk has finished.
//
// A job submitted while another is running (a second thread) or from
// inside a chunk (nesting) runs inline on its caller: never a deadlock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace kvserve {

class ComputePool {
 public:
  using ChunkFn = void (*)(void* ctx, int64_t chunk);
  // The most chunks one job may have (the packed word's field width).
  static constexpr int64_t kMaxChunks = 0xFFFF;

  // `workers` >= 0 threads besides the caller; `spin`: how long an idle
  // worker polls before parking.
  ComputePool(int workers, std::chrono::microseconds spin);
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  // Runs fn(ctx, c) for every c in [0, chunks) and returns when all have
  // finished. Precondition: 0 <= chunks <= kMaxChunks.
  void Run(int64_t chunks, ChunkFn fn, void* ctx);

  [[nodiscard]] int workers() const {
    return static_cast<int>(threads_.size());
  }

 private:
  void WorkerLoop();
  // Blocks until the job word's job id differs from `seen`; returns the
  // new word.
  uint64_t AwaitJob(uint32_t seen);
  // Claims and runs chunks of job `id` until none is left.
  void Drain(uint32_t id);

  const std::chrono::microseconds spin_;
  std::mutex run_mu_;  // one job at a time
  // (job id << 32) | (next chunk << 16) | chunks.
  std::atomic<uint64_t> job_{0};
  std::atomic<int64_t> finished_{0};  // chunks of the current job done
  ChunkFn fn_ = nullptr;              // written before job_ publishes it
  void* ctx_ = nullptr;
  std::atomic<uint32_t> wake_{0};  // futex word parked workers wait on
  std::atomic<int> parked_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace kvserve
