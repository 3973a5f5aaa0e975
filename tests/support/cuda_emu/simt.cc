// The SIMT emulator's scheduler (see simt.h): one launch at a time; the
// blocks of a grid run one after another on the calling thread, and the
// threads of a block are fibers (Boost.Context's fcontext: a switch costs
// tens of nanoseconds, against a system call per switch with ucontext)
// switched at barriers.
#include "tests/support/cuda_emu/simt.h"

#include <sys/mman.h>

#include <algorithm>
#include <boost/context/detail/fcontext.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/cuda_emu/state.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KV_EMU_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define KV_EMU_ASAN 1
#endif
#if defined(KV_EMU_ASAN)
#include <sanitizer/common_interface_defs.h>
#endif

namespace kvserve::cuda_emu {

const ThreadState* g_current = nullptr;
uint3 g_block_idx;
dim3 g_block_dim;
dim3 g_grid_dim;

namespace {

// Stack per CUDA thread: kernels keep small register arrays; sanitizer
// builds need room for redzones.
constexpr size_t kStackBytes = 256 * 1024;
constexpr int kMaxThreads = 1024;
// Device limits checked at launch (H100/H200 values).
constexpr size_t kDefaultSmem = 48 * 1024;
constexpr size_t kMaxOptInSmem = 227 * 1024;

enum class Wait { kRunnable, kBlock, kWarp, kDone };

namespace bctx = boost::context::detail;

struct Fiber {
  bctx::fcontext_t ctx = nullptr;
  ThreadState state;
  Wait wait = Wait::kRunnable;
  void* stack = nullptr;
};

// Everything one launch needs while its fibers run.
struct Launch {
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<uint64_t> exchange;     // one slot per thread (warp shuffles)
  std::vector<unsigned char> gather;  // kGatherBytes per thread
  std::vector<unsigned char> smem;
  bctx::fcontext_t scheduler = nullptr;  // set by each switch into a fiber
  Fiber* running = nullptr;
  std::string failure;  // first divergence seen
#if defined(KV_EMU_ASAN)
  void* fake_stack = nullptr;
  const void* main_bottom = nullptr;
  size_t main_size = 0;
#endif
};

std::mutex g_launch_mu;
Launch* g_launch = nullptr;

// Stacks outlive launches (mmap once, reused).
std::vector<void*>& StackPool() {
  static auto* pool = new std::vector<void*>();
  return *pool;
}

void* StackAt(size_t i) {
  std::vector<void*>& pool = StackPool();
  while (pool.size() <= i) {
    void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "cuda_emu: cannot map a fiber stack\n");
      std::abort();
    }
    pool.push_back(p);
  }
  return pool[i];
}

// Switches from the scheduler into `f` until it blocks or exits, telling
// ASan about the stack change.
void EnterFiber(Launch& l, Fiber& f) {
  l.running = &f;
  g_current = &f.state;
#if defined(KV_EMU_ASAN)
  __sanitizer_start_switch_fiber(&l.fake_stack, f.stack, kStackBytes);
#endif
  const bctx::transfer_t t = bctx::jump_fcontext(f.ctx, &l);
#if defined(KV_EMU_ASAN)
  __sanitizer_finish_switch_fiber(l.fake_stack, nullptr, nullptr);
#endif
  f.ctx = t.fctx;
}

// From the running fiber back to the scheduler; returns when resumed.
void LeaveFiber(Launch& l, Fiber& f) {
#if defined(KV_EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(f.wait == Wait::kDone ? nullptr : &fake,
                                 l.main_bottom, l.main_size);
#endif
  const bctx::transfer_t t = bctx::jump_fcontext(l.scheduler, nullptr);
  l.scheduler = t.fctx;
#if defined(KV_EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake, &l.main_bottom, &l.main_size);
#endif
}

void FiberEntry(bctx::transfer_t t) {
  Launch& l = *static_cast<Launch*>(t.data);
  l.scheduler = t.fctx;
#if defined(KV_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &l.main_bottom, &l.main_size);
#endif
  (*l.body)();
  Fiber& f = *l.running;
  f.wait = Wait::kDone;
  LeaveFiber(l, f);  // never resumed
  std::abort();
}

// Blocks the running fiber at a barrier of `kind` until the scheduler
// releases it.
void Block(Wait kind) {
  Launch& l = *g_launch;
  Fiber& f = *l.running;
  f.wait = kind;
  LeaveFiber(l, f);
  g_current = &f.state;
}

// Releases a barrier that every thread of a warp (shuffles, __syncwarp) or
// of the block (__syncthreads) has reached. Returns false when nothing can
// move: a barrier that some threads wait at while others wait elsewhere or
// have exited (CUDA's undefined behaviour: a hang or garbage on a GPU).
bool Release(Launch& l) {
  bool moved = false;
  const int n = static_cast<int>(l.fibers.size());
  for (int w = 0; w < n; w += 32) {
    bool all = true;
    for (int i = w; i < std::min(n, w + 32); ++i) {
      all = all && l.fibers[i].wait == Wait::kWarp;
    }
    if (!all) continue;
    for (int i = w; i < std::min(n, w + 32); ++i) {
      l.fibers[i].wait = Wait::kRunnable;
    }
    moved = true;
  }
  if (moved) return true;
  for (const Fiber& f : l.fibers) {
    if (f.wait != Wait::kBlock) return false;
  }
  for (Fiber& f : l.fibers) f.wait = Wait::kRunnable;
  return true;
}

// The fibers' order after each barrier: Fisher-Yates driven by xorshift64*
// (std::shuffle with mt19937 took a tenth of an emulated forward in the
// sanitizer build). Seeded per launch (NextLaunchSeed), so runs repeat.
class OrderRng {
 public:
  explicit OrderRng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull | 1) {}
  void Shuffle(std::vector<int>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[Below(i)]);
  }

 private:
  size_t Below(size_t n) {  // in [0, n)
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    const uint64_t r = (s_ * 0x2545F4914F6CDD1Dull) >> 32;
    return static_cast<size_t>((r * n) >> 32);
  }
  uint64_t s_;
};

// Runs one block to completion; false on a divergent barrier.
bool RunBlock(Launch& l, OrderRng& rng, const EmuOptions& opt) {
  const int n = static_cast<int>(l.fibers.size());
  for (int i = 0; i < n; ++i) {
    Fiber& f = l.fibers[i];
    f.wait = Wait::kRunnable;
    f.ctx = bctx::make_fcontext(static_cast<char*>(f.stack) + kStackBytes,
                                kStackBytes, FiberEntry);
  }
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  for (;;) {
    if (opt.schedule == Schedule::kShuffle) {
      rng.Shuffle(order);
    } else if (opt.schedule == Schedule::kReverse) {
      std::reverse(order.begin(), order.end());
    }
    for (int i : order) {
      Fiber& f = l.fibers[i];
      if (f.wait == Wait::kRunnable) EnterFiber(l, f);
    }
    bool done = true;
    for (const Fiber& f : l.fibers) done = done && f.wait == Wait::kDone;
    if (done) return true;
    if (!Release(l)) return false;
  }
}

// "threads 0-31 at __syncthreads, 32-63 exited": runs of equal state.
std::string DescribeDivergence(const Launch& l) {
  const auto name = [](Wait w) {
    return w == Wait::kBlock  ? "at __syncthreads"
           : w == Wait::kWarp ? "at a warp shuffle/__syncwarp"
           : w == Wait::kDone ? "exited"
                              : "running";
  };
  std::string s;
  const int n = static_cast<int>(l.fibers.size());
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && l.fibers[j + 1].wait == l.fibers[i].wait) ++j;
    if (!s.empty()) s += ", ";
    s += "threads " + std::to_string(i) + "-" + std::to_string(j) + " " +
         name(l.fibers[i].wait);
    i = j + 1;
  }
  return s;
}

cudaError_t CheckConfig(const void* func, dim3 grid, dim3 block, size_t smem) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 ||
      threads > kMaxThreads || block.x > 1024 || block.y > 1024 ||
      block.z > 64 || grid.x > 0x7fffffffu || grid.y > 65535 ||
      grid.z > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  const size_t limit =
      std::min(kMaxOptInSmem, std::max(kDefaultSmem, FuncMaxDynamicSmem(func)));
  if (smem > limit) return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

void SyncThreads() { Block(Wait::kBlock); }
void SyncWarp() { Block(Wait::kWarp); }

uint64_t WarpExchange(uint64_t bits, int src_lane) {
  Launch& l = *g_launch;
  const int self = g_current->linear;
  const int base = self - self % 32;
  l.exchange[self] = bits;
  SyncWarp();  // every lane has written
  const int src = base + src_lane;
  const uint64_t v =
      src < static_cast<int>(l.exchange.size()) ? l.exchange[src] : bits;
  SyncWarp();  // every lane has read before anyone writes again
  return v;
}

void WarpAllGather(const void* mine, size_t bytes, void* all) {
  Launch& l = *g_launch;
  const int self = g_current->linear;
  const int base = self - self % 32;
  if (bytes > kGatherBytes) {
    std::fprintf(stderr, "cuda_emu: WarpAllGather of %zu bytes\n", bytes);
    std::abort();
  }
  std::memcpy(&l.gather[self * kGatherBytes], mine, bytes);
  SyncWarp();  // every lane has written
  const int threads = static_cast<int>(l.fibers.size());
  for (int lane = 0; lane < 32; ++lane) {
    auto* dst = static_cast<unsigned char*>(all) + lane * bytes;
    if (base + lane < threads) {
      std::memcpy(dst, &l.gather[(base + lane) * kGatherBytes], bytes);
    } else {
      std::memset(dst, 0, bytes);  // lanes past a partial last warp
    }
  }
  SyncWarp();  // every lane has read before anyone writes again
}

unsigned char* DynamicSmem() { return g_launch->smem.data(); }

cudaError_t Run(const void* func, dim3 grid, dim3 block, size_t dynamic_smem,
                const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(g_launch_mu);
  const cudaError_t config = CheckConfig(func, grid, block, dynamic_smem);
  if (config != cudaSuccess) return SetLastError(config);
  const EmuOptions& opt = Options();
  Launch l;
  l.body = &body;
  const int n = static_cast<int>(block.x * block.y * block.z);
  l.fibers.resize(n);
  l.exchange.assign(n, 0);
  l.gather.assign(static_cast<size_t>(n) * kGatherBytes, 0);
  for (int i = 0; i < n; ++i) {
    Fiber& f = l.fibers[i];
    f.stack = StackAt(i);
    f.state.linear = i;
    f.state.thread_idx = make_uint3(i % block.x, (i / block.x) % block.y,
                                    i / (block.x * block.y));
  }
  g_launch = &l;
  g_block_dim = block;
  g_grid_dim = grid;
  OrderRng rng(NextLaunchSeed());
  for (uint32_t z = 0; z < grid.z; ++z) {
    for (uint32_t y = 0; y < grid.y; ++y) {
      for (uint32_t x = 0; x < grid.x; ++x) {
        g_block_idx = make_uint3(x, y, z);
        // Shared memory starts as garbage on a GPU: NaN bytes here.
        l.smem.assign(std::max<size_t>(dynamic_smem, 16), 0xff);
        if (!RunBlock(l, rng, opt)) {
          std::fprintf(stderr,
                       "cuda_emu: barrier divergence in block (%u,%u,%u): %s\n",
                       x, y, z, DescribeDivergence(l).c_str());
          g_launch = nullptr;
          g_current = nullptr;
          return SetLastError(cudaErrorLaunchFailure);
        }
      }
    }
  }
  g_launch = nullptr;
  g_current = nullptr;
  return cudaSuccess;
}

}  // namespace kvserve::cuda_emu
