// Process state of the emulated device shared by the scheduler (simt.cc)
// and the runtime/cuBLAS entry points (runtime.cc): the sticky last error,
// per-kernel attributes, and the options read from the environment:
//   KVSERVE_CUDA_EMU_SCHEDULE  shuffle (default) | forward | reverse: the
//                              order threads run between barriers; a
//                              missing barrier shows up as a wrong result
//                              under shuffle.
//   KVSERVE_CUDA_EMU_SMS       multiprocessors reported (default 8).
//   KVSERVE_CUDA_EMU_MEMORY    device memory in MiB (default 1024).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvserve::cuda_emu {

enum class Schedule { kShuffle, kForward, kReverse };

struct EmuOptions {
  Schedule schedule = Schedule::kShuffle;
  int sms = 8;
  size_t memory_bytes = size_t{1024} << 20;
};

const EmuOptions& Options();

// Records `err` as the sticky last error (unless cudaSuccess); returns it.
cudaError_t SetLastError(cudaError_t err);

// The cudaFuncAttributeMaxDynamicSharedMemorySize set for `func` (0: none).
size_t FuncMaxDynamicSmem(const void* func);

// A different seed for every launch (deterministic within a process).
uint64_t NextLaunchSeed();

// Makes `stream`'s copies deferred (runtime.cc): for a copy-only side
// stream, so that tests see what a missing event wait would read on a GPU.
void DeferCopies(cudaStream_t stream);

}  // namespace kvserve::cuda_emu
