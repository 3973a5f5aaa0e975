// Loads of KV blocks from the tiers (disk, remote) into memory the caller lends
// (pool blocks no request holds yet), on worker threads, so the engine's step
// never waits on a disk. A job's blocks are split into one contiguous part per
// worker (a long prompt loads on every core); a part reads in chain order
// and stops at its first miss or at the deadline. The result counts the
// blocks verified from the first on, up to the first that was not (later
// keys chain on it); the caller's `wake` runs on the worker that posts it.
//
// Thread contract: the workers write only the pieces a job names, and only
// until its result is posted; TakeDone's lock orders those writes before
// the caller reads them. Destruction cancels queued jobs and joins the
// workers: destroy the loader before the memory its jobs write to.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "kvtier/block_codec.h"
#include "kvtier/disk_tier.h"
#include "kvtier/remote_tier.h"
#include "kvtier/tier.h"

namespace kvserve::kvtier {

struct LoadJob {
  int64_t id = 0;
  Key ns = 0;
  uint64_t scope_tag = 0;
  absl::Time deadline = absl::InfiniteFuture();
  std::vector<LoadBlock> blocks;
};

struct LoadResult {
  int64_t id = 0;
  int32_t verified = 0;            // blocks[0, verified) hold their KV
  std::optional<MissReason> stop;  // why it stopped short, if it did
  double seconds = 0;
};

class TierLoader {
 public:
  // Either tier may be null when no block of a job names it.
  TierLoader(DiskTier* disk, RemoteTier* remote, Key salt, int threads,
             std::function<void()> wake);
  ~TierLoader();
  TierLoader(const TierLoader&) = delete;
  TierLoader& operator=(const TierLoader&) = delete;

  void Start(LoadJob job);
  // Results posted since the last call.
  [[nodiscard]] std::vector<LoadResult> TakeDone();
  // Jobs started and not yet taken by TakeDone.
  [[nodiscard]] int64_t in_flight() const;
  // Mean seconds per loaded block, exponentially weighted (0: none yet).
  [[nodiscard]] double seconds_per_block() const;

 private:
  // A job in flight and its parts' outcomes.
  struct Running {
    LoadJob job;
    absl::Time start;
    int parts_left = 0;
    std::vector<int32_t> verified;  // per part
    std::vector<std::optional<MissReason>> stop;
  };
  struct Part {
    std::shared_ptr<Running> run;
    int index = 0;
    size_t begin = 0, end = 0;  // blocks [begin, end)
  };

  void Work();
  // Loads part p's blocks; returns how many verified and why it stopped.
  std::pair<int32_t, std::optional<MissReason>> RunPart(const Part& p) const;
  static LoadResult Finish(const Running& run);

  DiskTier* const disk_;
  RemoteTier* const remote_;
  const Key salt_;
  const std::function<void()> wake_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Part> queue_;
  std::vector<LoadResult> done_;
  int64_t in_flight_ = 0;
  double seconds_per_block_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
  int threads_ = 1;
};

}  // namespace kvserve::kvtier
