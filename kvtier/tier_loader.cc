#include "kvtier/tier_loader.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace kvserve::kvtier {

TierLoader::TierLoader(DiskTier* disk, RemoteTier* remote, Key salt,
                       int threads, std::function<void()> wake)
    : disk_(disk),
      remote_(remote),
      salt_(salt),
      wake_(std::move(wake)),
      threads_(std::max(threads, 1)) {
  for (int i = 0; i < threads_; ++i) {
    workers_.emplace_back([this] { Work(); });
  }
}

TierLoader::~TierLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void TierLoader::Start(LoadJob job) {
  // Parts of at least kMinPart blocks: a short load is not worth a hand-off.
  constexpr size_t kMinPart = 16;
  const size_t n = job.blocks.size();
  const size_t parts = std::clamp<size_t>(n / kMinPart, 1, threads_);
  auto run = std::make_shared<Running>();
  run->job = std::move(job);
  run->start = absl::Now();
  run->parts_left = static_cast<int>(parts);
  run->verified.assign(parts, 0);
  run->stop.assign(parts, std::nullopt);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < parts; ++i) {
      queue_.push_back(
          {run, static_cast<int>(i), n * i / parts, n * (i + 1) / parts});
    }
    ++in_flight_;
  }
  cv_.notify_all();
}

std::vector<LoadResult> TierLoader::TakeDone() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LoadResult> out;
  out.swap(done_);
  in_flight_ -= static_cast<int64_t>(out.size());
  return out;
}

int64_t TierLoader::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

double TierLoader::seconds_per_block() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seconds_per_block_;
}

void TierLoader::Work() {
  pthread_setname_np(pthread_self(), "kv-tier-load");  // for top -H
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Part part = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const auto [verified, stop] = RunPart(part);
    lock.lock();
    Running& run = *part.run;
    run.verified[part.index] = verified;
    run.stop[part.index] = stop;
    if (--run.parts_left > 0) continue;
    const LoadResult r = Finish(run);
    if (r.verified > 0) {
      constexpr double kWeight = 0.2;
      const double per = r.seconds / r.verified;
      seconds_per_block_ =
          seconds_per_block_ == 0
              ? per
              : (1 - kWeight) * seconds_per_block_ + kWeight * per;
    }
    done_.push_back(r);
    lock.unlock();
    if (wake_) wake_();
    lock.lock();
  }
}

std::pair<int32_t, std::optional<MissReason>> TierLoader::RunPart(
    const Part& p) const {
  const LoadJob& job = p.run->job;
  int32_t verified = 0;
  for (size_t i = p.begin; i < p.end;) {
    if (absl::Now() >= job.deadline) return {verified, MissReason::kDeadline};
    const LoadBlock& b = job.blocks[i];
    if (b.remote) {
      // The run of remote blocks goes as pipelined chunks.
      size_t j = i;
      while (j < p.end && job.blocks[j].remote) ++j;
      const auto [n, miss] =
          remote_->LoadRun(absl::MakeConstSpan(job.blocks).subspan(i, j - i),
                           job.ns, job.scope_tag, job.deadline);
      verified += n;
      if (miss.has_value()) return {verified, miss};
      i = j;
      continue;
    }
    const Expected want{salt_,  b.key,    b.parent,
                        job.ns, b.tokens, disk_->payload_bytes()};
    if (std::optional<MissReason> miss =
            disk_->Load(want, job.scope_tag, b.dst)) {
      return {verified, miss};
    }
    ++verified;
    ++i;
  }
  return {verified, std::nullopt};
}

LoadResult TierLoader::Finish(const Running& run) {
  LoadResult r;
  r.id = run.job.id;
  // Verified from the first block on: the first part that stopped short
  // ends the run.
  for (size_t i = 0; i < run.verified.size(); ++i) {
    r.verified += run.verified[i];
    if (run.stop[i].has_value()) {
      r.stop = run.stop[i];
      break;
    }
  }
  r.seconds = SecondsSince(run.start);
  return r;
}

}  // namespace kvserve::kvtier
