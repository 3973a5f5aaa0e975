#include "common/thread_pool.h"

namespace kvserve {
namespace {

// Set while a thread runs a chunk: a nested job runs inline.
thread_local bool in_chunk = false;

constexpr uint32_t JobId(uint64_t w) { return static_cast<uint32_t>(w >> 32); }
constexpr int64_t NextChunk(uint64_t w) {
  return static_cast<int64_t>((w >> 16) & 0xFFFF);
}
constexpr int64_t NumChunks(uint64_t w) {
  return static_cast<int64_t>(w & 0xFFFF);
}
constexpr uint64_t PackJob(uint32_t id, int64_t chunks) {
  return (uint64_t{id} << 32) | static_cast<uint64_t>(chunks);
}
constexpr uint64_t kOneChunk = uint64_t{1} << 16;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

void RunInline(int64_t chunks, ComputePool::ChunkFn fn, void* ctx) {
  for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
}

}  // namespace

ComputePool::ComputePool(int workers, std::chrono::microseconds spin)
    : spin_(spin) {
  threads_.reserve(static_cast<size_t>(workers > 0 ? workers : 0));
  for (int i = 0; i < workers; ++i) {
    threads_.emplace_back([this] { WorkerLoop(); });
  }
}

ComputePool::~ComputePool() {
  stop_.store(true, std::memory_order_seq_cst);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ComputePool::Run(int64_t chunks, ChunkFn fn, void* ctx) {
  if (chunks <= 0) return;
  if (chunks == 1 || threads_.empty() || in_chunk) {
    RunInline(chunks, fn, ctx);
    return;
  }
  std::unique_lock<std::mutex> lock(run_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {  // another thread's job is running
    RunInline(chunks, fn, ctx);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  finished_.store(0, std::memory_order_relaxed);
  const uint32_t id = JobId(job_.load(std::memory_order_relaxed)) + 1;
  // Publishes fn_, ctx_ and the reset count with the job (seq_cst: ordered
  // against the parked_ load, see AwaitJob).
  job_.store(PackJob(id, chunks), std::memory_order_seq_cst);
  if (parked_.load(std::memory_order_seq_cst) > 0) {
    wake_.fetch_add(1, std::memory_order_seq_cst);
    wake_.notify_all();
  }
  Drain(id);
  // Chunks other threads claimed may still run; a worker that holds one
  // may be waiting for this core.
  for (int spins = 0; finished_.load(std::memory_order_acquire) < chunks;
       ++spins) {
    if (spins < 64) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

void ComputePool::Drain(uint32_t id) {
  uint64_t w = job_.load(std::memory_order_acquire);
  while (JobId(w) == id && NextChunk(w) < NumChunks(w)) {
    if (!job_.compare_exchange_weak(w, w + kOneChunk, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      continue;  // w holds the current word
    }
    // The claimed chunk keeps job `id` unfinished, so fn_ and ctx_ stay
    // those of job `id` until finished_ counts it.
    in_chunk = true;
    fn_(ctx_, NextChunk(w));
    in_chunk = false;
    finished_.fetch_add(1, std::memory_order_release);
    w = job_.load(std::memory_order_acquire);
  }
}

uint64_t ComputePool::AwaitJob(uint32_t seen) {
  const auto deadline = std::chrono::steady_clock::now() + spin_;
  for (int i = 1;; ++i) {
    const uint64_t w = job_.load(std::memory_order_acquire);
    if (JobId(w) != seen || stop_.load(std::memory_order_relaxed)) return w;
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= deadline) break;
    CpuRelax();
  }
  // Park. Either Run sees parked_ > 0 and bumps wake_ (so the wait below
  // returns), or this thread sees the new job: both sides use seq_cst.
  for (;;) {
    const uint32_t ticket = wake_.load(std::memory_order_seq_cst);
    parked_.fetch_add(1, std::memory_order_seq_cst);
    const uint64_t w = job_.load(std::memory_order_seq_cst);
    if (JobId(w) != seen || stop_.load(std::memory_order_seq_cst)) {
      parked_.fetch_sub(1, std::memory_order_seq_cst);
      return w;
    }
    wake_.wait(ticket, std::memory_order_seq_cst);
    parked_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ComputePool::WorkerLoop() {
  // Job 0 is "none": a worker that starts after the first Run published
  // job 1 must still see it as new.
  uint32_t seen = 0;
  for (;;) {
    const uint64_t w = AwaitJob(seen);
    if (stop_.load(std::memory_order_acquire)) return;
    seen = JobId(w);
    Drain(seen);
  }
}

}  // namespace kvserve
