// The CUDA runtime API subset kvserve calls, for KVSERVE_CUDA_EMU builds:
// one emulated device whose memory is host memory. Allocations are tracked,
// start as 0xff bytes (NaN in bf16 and fp32, like the garbage of a fresh
// cudaMalloc), and every copy or memset into or out of device memory is
// checked against its allocation (cudaErrorInvalidValue outside it). Every
// call is synchronous (a kernel has finished when its launch returns) except
// the copies on a stream marked with DeferCopies: those wait in the stream's
// queue until something waits for them (a synchronize, an event synchronize
// or query, a stream waiting on its event), so a missing wait shows up as
// stale bytes. An event query that runs queued copies answers
// cudaErrorNotReady once: a caller that polls must poll again.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "tests/support/cuda_emu/state.h"

struct CUstream_st {
  bool deferred = false;
  std::deque<std::function<void()>> ops;  // deferred copies, in order
  uint64_t enqueued = 0, done = 0;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point at;
  CUstream_st* stream = nullptr;  // a deferred stream, or none (complete)
  uint64_t seq = 0;               // complete once stream->done >= seq
};

namespace kvserve::cuda_emu {
namespace {

std::mutex g_mu;
cudaError_t g_last_error = cudaSuccess;
std::map<const void*, size_t>& FuncSmem() {
  static auto* m = new std::map<const void*, size_t>();
  return *m;
}
// Device allocations: start -> bytes.
std::map<const char*, size_t>& Allocations() {
  static auto* m = new std::map<const char*, size_t>();
  return *m;
}
size_t g_used = 0;
uint64_t g_launches = 0;

EmuOptions ReadOptions() {
  EmuOptions o;
  if (const char* s = std::getenv("KVSERVE_CUDA_EMU_SCHEDULE")) {
    const std::string v = s;
    if (v == "forward") o.schedule = Schedule::kForward;
    if (v == "reverse") o.schedule = Schedule::kReverse;
  }
  if (const char* s = std::getenv("KVSERVE_CUDA_EMU_SMS")) {
    o.sms = std::max(1, std::atoi(s));
  }
  if (const char* s = std::getenv("KVSERVE_CUDA_EMU_MEMORY")) {
    o.memory_bytes = static_cast<size_t>(std::max(1, std::atoi(s))) << 20;
  }
  return o;
}

// True when [p, p + n) lies in one device allocation; `is_device` tells
// whether p is inside any allocation at all.
bool InDevice(const void* p, size_t n, bool* is_device) {
  const char* c = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lock(g_mu);
  auto& a = Allocations();
  auto it = a.upper_bound(c);
  if (it == a.begin()) {
    *is_device = false;
    return false;
  }
  --it;
  *is_device = c < it->first + it->second;
  return *is_device && c + n <= it->first + it->second;
}

// A device-side range must fit its allocation; host ranges are not checked.
bool RangeOk(const void* p, size_t n, bool must_be_device) {
  bool dev = false;
  const bool fits = InDevice(p, n, &dev);
  if (must_be_device) return fits;
  return !dev || fits;
}

}  // namespace

const EmuOptions& Options() {
  static const EmuOptions o = ReadOptions();
  return o;
}

cudaError_t SetLastError(cudaError_t err) {
  if (err != cudaSuccess) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_last_error = err;
  }
  return err;
}

size_t FuncMaxDynamicSmem(const void* func) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = FuncSmem().find(func);
  return it == FuncSmem().end() ? 0 : it->second;
}

uint64_t NextLaunchSeed() {
  std::lock_guard<std::mutex> lock(g_mu);
  return 0x9e3779b97f4a7c15ull * ++g_launches;
}

}  // namespace kvserve::cuda_emu

namespace kvserve::cuda_emu {

void DeferCopies(cudaStream_t stream) { stream->deferred = true; }

namespace {

// Runs `s`'s queued copies up to number `upto`; false if none was queued.
bool RunQueued(CUstream_st* s, uint64_t upto) {
  if (s == nullptr || s->done >= upto) return false;
  while (s->done < upto && !s->ops.empty()) {
    std::function<void()> op = std::move(s->ops.front());
    s->ops.pop_front();
    op();
    ++s->done;
  }
  return true;
}

}  // namespace
}  // namespace kvserve::cuda_emu

namespace emu = kvserve::cuda_emu;

cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return emu::SetLastError(cudaErrorInvalidValue);
  {
    std::lock_guard<std::mutex> lock(emu::g_mu);
    if (emu::g_used + size > emu::Options().memory_bytes) {
      return emu::SetLastError(cudaErrorMemoryAllocation);
    }
  }
  const size_t rounded = (std::max<size_t>(size, 1) + 255) / 256 * 256;
  char* p = static_cast<char*>(std::aligned_alloc(256, rounded));
  if (p == nullptr) return emu::SetLastError(cudaErrorMemoryAllocation);
  std::memset(p, 0xff, rounded);
  std::lock_guard<std::mutex> lock(emu::g_mu);
  emu::Allocations()[p] = size;
  emu::g_used += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(emu::g_mu);
  auto it = emu::Allocations().find(static_cast<const char*>(ptr));
  if (it == emu::Allocations().end()) {
    emu::g_last_error = cudaErrorInvalidValue;
    return cudaErrorInvalidValue;
  }
  emu::g_used -= it->second;
  emu::Allocations().erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return emu::SetLastError(cudaErrorInvalidValue);
  *ptr = std::malloc(std::max<size_t>(size, 1));
  return *ptr != nullptr ? cudaSuccess
                         : emu::SetLastError(cudaErrorMemoryAllocation);
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int /*flags*/) {
  return cudaMallocHost(ptr, size);
}

cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count,
                       cudaMemcpyKind kind) {
  if (count == 0) return cudaSuccess;
  const bool dst_dev =
      kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev =
      kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault ||
      dst == nullptr || src == nullptr ||
      !emu::RangeOk(dst, count, dst_dev && kind != cudaMemcpyDefault) ||
      !emu::RangeOk(src, count, src_dev && kind != cudaMemcpyDefault)) {
    return emu::SetLastError(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  if (stream == nullptr || !stream->deferred) {
    return cudaMemcpy(dst, src, count, kind);
  }
  // Arguments are checked now, as the runtime does; the bytes move later.
  const bool dst_dev = kind == cudaMemcpyHostToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost;
  if ((kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost) ||
      dst == nullptr || src == nullptr || !emu::RangeOk(dst, count, dst_dev) ||
      !emu::RangeOk(src, count, src_dev)) {
    return emu::SetLastError(cudaErrorInvalidValue);
  }
  stream->ops.push_back([=] { std::memmove(dst, src, count); });
  ++stream->enqueued;
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src,
                              size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) {
    return emu::SetLastError(cudaErrorInvalidPitchValue);
  }
  for (size_t r = 0; r < height; ++r) {
    const cudaError_t err = cudaMemcpyAsync(
        static_cast<char*>(dst) + r * dpitch,
        static_cast<const char*>(src) + r * spitch, width, kind, stream);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t count) {
  if (count == 0) return cudaSuccess;
  if (!emu::RangeOk(dst, count, true)) {
    return emu::SetLastError(cudaErrorInvalidValue);
  }
  std::memset(dst, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count,
                            cudaStream_t /*stream*/) {
  return cudaMemset(dst, value, count);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = new CUstream_st();
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream,
                                      unsigned int /*flags*/) {
  return cudaStreamCreate(stream);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream != nullptr) emu::RunQueued(stream, stream->enqueued);
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr) emu::RunQueued(stream, stream->enqueued);
  return cudaSuccess;
}
// `stream`'s later work waits for `event`: a synchronous stream runs the
// event's queued copies now; a deferred one runs them before its own.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned int /*flags*/) {
  if (event->stream == nullptr || event->stream == stream) return cudaSuccess;
  emu::RunQueued(event->stream, event->seq);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  event->at = std::chrono::steady_clock::now();
  const bool deferred = stream != nullptr && stream->deferred;
  event->stream = deferred ? stream : nullptr;
  event->seq = deferred ? stream->enqueued : 0;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  emu::RunQueued(event->stream, event->seq);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  return emu::RunQueued(event->stream, event->seq) ? cudaErrorNotReady
                                                   : cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start,
                                 cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  std::lock_guard<std::mutex> lock(emu::g_mu);
  const cudaError_t e = emu::g_last_error;
  emu::g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() {
  std::lock_guard<std::mutex> lock(emu::g_mu);
  return emu::g_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure (emulator: barrier divergence)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    default:
      return "unknown error";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : emu::SetLastError(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr,
                                   int device) {
  if (device != 0) return emu::SetLastError(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = emu::Options().sms;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = 227 * 1024;
      break;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    default:
      return emu::SetLastError(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return emu::SetLastError(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::strncpy(prop->name, "kvserve SIMT emulator (CPU)",
               sizeof(prop->name) - 1);
  prop->totalGlobalMem = emu::Options().memory_bytes;
  prop->multiProcessorCount = emu::Options().sms;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  prop->major = 9;
  prop->minor = 0;
  prop->l2CacheSize = 4 << 20;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  std::lock_guard<std::mutex> lock(emu::g_mu);
  *total = emu::Options().memory_bytes;
  *free_bytes = *total - emu::g_used;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr,
                                 int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || value > 227 * 1024) {
    return emu::SetLastError(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lock(emu::g_mu);
  emu::FuncSmem()[func] = static_cast<size_t>(value);
  return cudaSuccess;
}
