// Kernel launch and dynamic shared memory, spelled once for nvcc and for the
// SIMT emulator (tests/support/cuda_emu/simt.h, option KVSERVE_CUDA_EMU):
//
//   const dim3 grid(...);
//   KV_LAUNCH(grid, threads, smem_bytes, stream, Kernel<D>)(args...);
//   KV_DYNAMIC_SMEM(float, buf);  // inside a kernel: float buf[] in smem
//
// The kernel goes last (it may contain commas); grid and block must be
// single expressions without top-level commas.
#pragma once

#if defined(KVSERVE_CUDA_EMU)
#define KV_LAUNCH(grid, block, smem, stream, ...) \
  ::kvserve::cuda_emu::Launcher(__VA_ARGS__, grid, block, smem, stream)
#define KV_DYNAMIC_SMEM(type, name) \
  type* const name = reinterpret_cast<type*>(::kvserve::cuda_emu::DynamicSmem())
#else
#define KV_LAUNCH(grid, block, smem, stream, ...) \
  __VA_ARGS__<<<grid, block, smem, stream>>>
#define KV_DYNAMIC_SMEM(type, name) extern __shared__ __align__(16) type name[]
#endif
