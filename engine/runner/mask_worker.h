// MaskWorker: fills the next-token masks of a step's constrained sequences
// (GrammarState::FillMask) on a thread of its own while the engine thread
// runs the forward (--structured-output-overlap). A sequence's next mask
// depends only on the tokens it has accepted, all known before the
// forward; the forward does not touch the states, and the engine thread
// waits for the worker before it samples, so each state has one user at a
// time. On a machine whose cores the forward already fills, the worker
// takes CPU from it: docs/PERFORMANCE.md has the measurement.
#pragma once

#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grammar/grammar_state.h"

namespace kvserve::engine {

class MaskWorker {
 public:
  MaskWorker();
  ~MaskWorker();
  MaskWorker(const MaskWorker&) = delete;
  MaskWorker& operator=(const MaskWorker&) = delete;

  // Starts filling `states`' masks; returns at once. The caller leaves them
  // alone until Wait returns.
  void Start(std::vector<grammar::GrammarState*> states);
  // Returns once the states of the last Start are filled.
  void Wait();

 private:
  void Run();

  absl::Mutex mu_;
  std::vector<grammar::GrammarState*> work_ ABSL_GUARDED_BY(mu_);
  bool pending_ ABSL_GUARDED_BY(mu_) = false;  // work_ not yet done
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvserve::engine
