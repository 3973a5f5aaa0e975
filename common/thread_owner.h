// ThreadOwner: a debug check that an object single-threaded by contract is
// only used from one thread. It records the owning thread at the first
// CheckOwner() call (or at Rebind()) and KV_DCHECKs that later calls come
// from that same thread. It owns nothing else and takes no lock; where
// KV_DCHECK is off (release builds without sanitizers) CheckOwner() does
// nothing.
//
// Typical use: a member `ThreadOwner owner_;` and `owner_.CheckOwner();` at
// the top of each public mutating method. An object built on one thread and
// handed to another before its first use needs nothing; one already used
// before the hand-off calls Rebind() on the new thread.
#pragma once

#include <atomic>
#include <thread>

#include "common/check.h"

namespace kvserve {

class ThreadOwner {
 public:
  ThreadOwner() = default;
  // A copy is a new object: it binds on its own first use.
  ThreadOwner(const ThreadOwner&) {}
  ThreadOwner& operator=(const ThreadOwner&) { return *this; }

  // Binds to the calling thread when unbound, then checks that the caller
  // is the owner (KV_DCHECK: aborts with `what` in debug and sanitizer
  // builds).
  void CheckOwner(const char* what) const {
#if KV_DCHECK_IS_ON
    KV_DCHECK(IsOwnerThread(), "thread ownership: ", what,
              " called from a thread other than its owner");
#else
    static_cast<void>(what);
#endif
  }

  // Binds to the calling thread when unbound; true when the caller is the
  // owner. Active in every build.
  [[nodiscard]] bool IsOwnerThread() const {
    const std::thread::id self = std::this_thread::get_id();
    std::thread::id expected{};
    if (owner_.compare_exchange_strong(expected, self)) return true;
    return expected == self;
  }

  // Makes the calling thread the owner (a hand-off after use elsewhere).
  void Rebind() { owner_.store(std::this_thread::get_id()); }

 private:
  mutable std::atomic<std::thread::id> owner_{};
};

}  // namespace kvserve
