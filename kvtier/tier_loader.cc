#include "kvtier/tier_loader.h"

#include <utility>

#include "absl/time/clock.h"
#include "common/clock.h"

namespace kvserve::kvtier {

TierLoader::TierLoader(DiskTier* disk, Key salt, int threads,
                       std::function<void()> wake)
    : disk_(disk), salt_(salt), wake_(std::move(wake)) {
  for (int i = 0; i < std::max(threads, 1); ++i) {
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
    ++in_flight_;
  }
  cv_.notify_one();
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
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    LoadJob job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    LoadResult r = Run(job);
    lock.lock();
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

LoadResult TierLoader::Run(const LoadJob& job) const {
  const absl::Time t0 = absl::Now();
  LoadResult r;
  r.id = job.id;
  for (const LoadBlock& b : job.blocks) {
    if (absl::Now() >= job.deadline) {
      r.stop = MissReason::kDeadline;
      break;
    }
    const Expected want{salt_,  b.key,    b.parent,
                        job.ns, b.tokens, disk_->payload_bytes()};
    if (std::optional<MissReason> miss =
            disk_->Load(want, job.scope_tag, b.dst)) {
      r.stop = miss;
      break;
    }
    ++r.verified;
  }
  r.seconds = SecondsSince(t0);
  return r;
}

}  // namespace kvserve::kvtier
