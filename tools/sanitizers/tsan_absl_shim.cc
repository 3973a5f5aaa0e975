// ThreadSanitizer builds only (KVSERVE_SANITIZE=thread; linked into every
// executable of that build): makes Debian's abseil synchronization visible
// to TSan.
//
// Why: Debian's libabsl_synchronization is not built with TSan, so TSan
// sees neither absl::Mutex's lock/unlock nor Notification's notify/wait,
// and reports every pair of accesses that an absl::Mutex orders as a race
// (the "data races" in the engine's queue counters, which are all read and
// written under one mutex). The spawned TSan-built daemon then died of
// halt_on_error in the middle of the e2e tests (it seemed to stop answering
// mid-stream).
//
// How: the executable defines the member functions the project calls; each
// calls the real one (found with dlsym(RTLD_NEXT), after this executable in
// lookup order: the shared library) and tells TSan the happens-before edge:
// release before giving a mutex up (Unlock, before waiting in Await or
// CondVar::Wait, Notify), acquire after getting it. That is exactly what a
// mutex orders; TSan's own lock-order (deadlock) checks stay off for these.
// Calls from inside libgrpc and the abseil libraries still go to the real
// functions directly (their races are suppressed in tsan.supp).
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();

namespace {

// NOTE: the mangled names carry Debian's inline namespace (absl::debian3).
template <typename Fn>
Fn Real(const char* mangled) {
  void* p = dlsym(RTLD_NEXT, mangled);
  if (p == nullptr) {
    std::fprintf(stderr, "tsan_absl_shim: %s not found: %s\n", mangled,
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// Runs `f` with this thread's memory accesses ignored. For the calls that
// may evaluate absl::Conditions: abseil evaluates a waiter's condition in
// whichever thread unlocks, inside the library, which no annotation from
// out here can order before the waiter's next use of that (often stack)
// memory. The conditions only read state the mutex guards.
template <typename F>
auto Ignoring(F f) {
  __tsan_ignore_thread_begin();
  auto result = f();
  __tsan_ignore_thread_end();
  return result;
}

#define KV_SHIM_NAME(s) "_ZN4absl7debian3" s
#define KV_SHIM_CNAME(s) "_ZNK4absl7debian3" s

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>(KV_SHIM_NAME("5Mutex4LockEv"));
  real(this);
  Acquire(this);
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>(KV_SHIM_NAME("5Mutex6UnlockEv"));
  Release(this);
  Ignoring([this] {
    real(this);
    return 0;
  });
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>(KV_SHIM_NAME("5Mutex7TryLockEv"));
  const bool got = real(this);
  if (got) Acquire(this);
  return got;
}

void Mutex::ReaderLock() {
  static auto real =
      Real<void (*)(Mutex*)>(KV_SHIM_NAME("5Mutex10ReaderLockEv"));
  real(this);
  Acquire(this);
}

void Mutex::ReaderUnlock() {
  static auto real =
      Real<void (*)(Mutex*)>(KV_SHIM_NAME("5Mutex12ReaderUnlockEv"));
  Release(this);
  Ignoring([this] {
    real(this);
    return 0;
  });
}

bool Mutex::ReaderTryLock() {
  static auto real =
      Real<bool (*)(Mutex*)>(KV_SHIM_NAME("5Mutex13ReaderTryLockEv"));
  const bool got = real(this);
  if (got) Acquire(this);
  return got;
}

void Mutex::Await(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      KV_SHIM_NAME("5Mutex5AwaitERKNS0_9ConditionE"));
  Release(this);
  Ignoring([&] {
    real(this, cond);
    return 0;
  });
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Duration)>(
      KV_SHIM_NAME("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE"));
  Release(this);
  const bool met = Ignoring([&] { return real(this, cond, timeout); });
  Acquire(this);
  return met;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static auto real = Real<bool (*)(Mutex*, const Condition&, Time)>(
      KV_SHIM_NAME("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE"));
  Release(this);
  const bool met = Ignoring([&] { return real(this, cond, deadline); });
  Acquire(this);
  return met;
}

void Mutex::LockWhen(const Condition& cond) {
  static auto real = Real<void (*)(Mutex*, const Condition&)>(
      KV_SHIM_NAME("5Mutex8LockWhenERKNS0_9ConditionE"));
  Ignoring([&] {
    real(this, cond);
    return 0;
  });
  Acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static auto real =
      Real<bool (*)(Mutex*, const Condition&, Duration)>(KV_SHIM_NAME(
          "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE"));
  const bool met = Ignoring([&] { return real(this, cond, timeout); });
  Acquire(this);
  return met;
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>(
      KV_SHIM_NAME("7CondVar4WaitEPNS0_5MutexE"));
  Release(mu);
  Ignoring([&] {
    real(this, mu);
    return 0;
  });
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      KV_SHIM_NAME("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE"));
  Release(mu);
  const bool timed_out = Ignoring([&] { return real(this, mu, timeout); });
  Acquire(mu);
  return timed_out;
}

// Notification. NOTE: HasBeenNotified() is inline in the header (it reads
// the flag itself), so a caller that only polls it gets no edge from here.
void Notification::Notify() {
  static auto real =
      Real<void (*)(Notification*)>(KV_SHIM_NAME("12Notification6NotifyEv"));
  Release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>(
      KV_SHIM_CNAME("12Notification19WaitForNotificationEv"));
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real =
      Real<bool (*)(const Notification*, Duration)>(KV_SHIM_CNAME(
          "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE"));
  const bool yes = real(this, timeout);
  if (yes) Acquire(this);
  return yes;
}

ABSL_NAMESPACE_END
}  // namespace absl
