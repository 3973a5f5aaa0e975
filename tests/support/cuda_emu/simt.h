// SIMT emulator for the CUDA kernels of models/cuda/ (CMake option
// KVSERVE_CUDA_EMU). With it, the .cu files are compiled by the host C++
// compiler with this header force-included, and kernels run on the CPU: every
// CUDA thread of a block is a fiber with its own stack, and the block's
// fibers run one at a time until each reaches a barrier (__syncthreads, a
// warp shuffle, __syncwarp), in an order reshuffled after every barrier.
// Launch configurations are checked like the CUDA runtime checks them.
//
// What it is for: running the real kernel source in CI where no GPU exists,
// so that indexing, masking, split-K merges and barrier placement are tested
// on every commit; under ASan, device buffers are host heap blocks and an
// out-of-bounds access is reported like compute-sanitizer's memcheck. A
// barrier that some threads of a block (or lanes of a warp) never reach is
// reported as divergence. What it cannot show: speed, real memory ordering
// between blocks (blocks run one after another), alignment faults.
//
// Invariant: only one launch runs at a time (a process-wide mutex), so a
// static `__shared__` variable (a function-local static here) is private to
// the block that is running.
#pragma once

#if !defined(KVSERVE_CUDA_EMU)
#error "tests/support/cuda_emu/simt.h is for KVSERVE_CUDA_EMU builds only"
#endif

// Qualifiers first, so that the CUDA headers keep these definitions.
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>  // the global cos, sqrtf, expf, exp2f of device code

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

namespace kvserve::cuda_emu {

// The running CUDA thread's coordinates.
struct ThreadState {
  uint3 thread_idx;
  int linear = 0;  // x + y * bx + z * bx * by
};

extern const ThreadState* g_current;
extern uint3 g_block_idx;
extern dim3 g_block_dim;
extern dim3 g_grid_dim;

inline const ThreadState& Current() { return *g_current; }

// Barriers of the running block: every live thread of the block / warp.
void SyncThreads();
void SyncWarp();
// Exchanges 64-bit values among the lanes of the caller's warp: returns the
// value `src_lane` passed (all lanes must call it together).
uint64_t WarpExchange(uint64_t bits, int src_lane);
// Copies `bytes` (at most kGatherBytes) from every lane of the caller's warp
// into all[lane * bytes ...] (all lanes must call it together): the
// emulator's building block for warp-wide instructions such as mma.sync.
constexpr size_t kGatherBytes = 32;
void WarpAllGather(const void* mine, size_t bytes, void* all);
// Start of the running launch's dynamic shared memory (16-byte aligned).
unsigned char* DynamicSmem();

// Runs `body` once per thread of every block of grid x block and returns
// the error the CUDA runtime would report for the configuration (or for a
// barrier divergence, cudaErrorLaunchFailure); also sets the sticky last
// error like a real launch. `func` identifies the kernel (for its
// cudaFuncSetAttribute limits).
cudaError_t Run(const void* func, dim3 grid, dim3 block, size_t dynamic_smem,
                const std::function<void()>& body);

// Launcher(kernel, grid, block, smem, stream)(args...): the emulated
// kernel<<<grid, block, smem, stream>>>(args...). Arguments are converted to
// the kernel's parameter types once, as the runtime copies them.
template <typename... P>
class Launcher {
 public:
  Launcher(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
           cudaStream_t /*stream*/)
      : kernel_(kernel), grid_(grid), block_(block), smem_(smem) {}

  template <typename... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel argument count");
    const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    (void)Run(reinterpret_cast<const void*>(kernel_), grid_, block_, smem_,
              [&] { std::apply(kernel_, params); });
  }

 private:
  void (*kernel_)(P...);
  dim3 grid_, block_;
  size_t smem_;
};

template <typename T>
inline uint64_t ToBits(T v) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>);
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <typename T>
inline T FromBits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}

}  // namespace kvserve::cuda_emu

#define threadIdx (::kvserve::cuda_emu::Current().thread_idx)
#define blockIdx (::kvserve::cuda_emu::g_block_idx)
#define blockDim (::kvserve::cuda_emu::g_block_dim)
#define gridDim (::kvserve::cuda_emu::g_grid_dim)

inline void __syncthreads() { ::kvserve::cuda_emu::SyncThreads(); }
inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  ::kvserve::cuda_emu::SyncWarp();
}

// Full-warp shuffles (width 32), the only form the kernels use.
template <typename T>
inline T __shfl_xor_sync(unsigned /*mask*/, T v, int lane_mask,
                         int /*width*/ = 32) {
  namespace e = ::kvserve::cuda_emu;
  const int lane = e::Current().linear % 32;
  return e::FromBits<T>(e::WarpExchange(e::ToBits(v), lane ^ lane_mask));
}
template <typename T>
inline T __shfl_sync(unsigned /*mask*/, T v, int src_lane, int /*width*/ = 32) {
  namespace e = ::kvserve::cuda_emu;
  return e::FromBits<T>(e::WarpExchange(e::ToBits(v), src_lane & 31));
}

// nvcc's cuda_runtime.h overload that takes the kernel itself.
template <typename... P>
inline cudaError_t cudaFuncSetAttribute(void (*kernel)(P...),
                                        cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr,
                                value);
}

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

// Device-side integer min/max of CUDA's math headers.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
