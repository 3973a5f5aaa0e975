// MaskWorker's thread. See mask_worker.h.
#include "engine/runner/mask_worker.h"

#include <pthread.h>

#include <utility>

namespace kvserve::engine {

MaskWorker::MaskWorker() : thread_([this] { Run(); }) {}

MaskWorker::~MaskWorker() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void MaskWorker::Start(std::vector<grammar::GrammarState*> states) {
  absl::MutexLock lock(&mu_);
  work_ = std::move(states);
  pending_ = true;
}

void MaskWorker::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* pending) { return !*pending; }, &pending_));
}

void MaskWorker::Run() {
  pthread_setname_np(pthread_self(), "kv-masks");
  while (true) {
    std::vector<grammar::GrammarState*> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return pending_ || stop_;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      work.swap(work_);
    }
    for (grammar::GrammarState* s : work) s->FillMask();
    absl::MutexLock lock(&mu_);
    pending_ = false;
  }
}

}  // namespace kvserve::engine
