// Happens-before annotations for ThreadSanitizer builds; no-ops otherwise.
// For hand-offs made inside uninstrumented libraries (Debian's gRPC): the
// code that gives an object to the library releases it, the callback the
// library runs later acquires it, so TSan sees the order gRPC guarantees.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define KVSERVE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVSERVE_TSAN 1
#endif
#endif

#ifdef KVSERVE_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#define KV_TSAN_RELEASE(addr) __tsan_release(static_cast<void*>(addr))
#define KV_TSAN_ACQUIRE(addr) __tsan_acquire(static_cast<void*>(addr))
#else
#define KV_TSAN_RELEASE(addr) static_cast<void>(0)
#define KV_TSAN_ACQUIRE(addr) static_cast<void>(0)
#endif
