#include "common/thread_pool.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/parallel.h"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// Runs `f(c)` for every chunk of a job, through the pool's C interface.
template <typename F>
void RunJob(ComputePool& pool, int64_t chunks, F& f) {
  pool.Run(
      chunks, [](void* ctx, int64_t c) { (*static_cast<F*>(ctx))(c); }, &f);
}

// Waits until `count` reaches `want` or 5 s pass; returns whether it did.
bool AwaitCount(const std::atomic<int>& count, int want) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (count.load() < want) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(ComputePoolTest, EveryChunkRunsOnceAndIsVisibleAfterRun) {
  ComputePool pool(3, microseconds(50));
  std::vector<int> hits;  // plain ints: Run's return must publish them
  for (int job = 0; job < 3000; ++job) {
    const int64_t chunks = 1 + job % 97;
    hits.assign(static_cast<size_t>(chunks), 0);
    auto f = [&](int64_t c) { hits[static_cast<size_t>(c)] += 1; };
    RunJob(pool, chunks, f);
    for (int64_t c = 0; c < chunks; ++c) {
      ASSERT_EQ(hits[static_cast<size_t>(c)], 1)
          << "job " << job << " chunk " << c;
    }
  }
}

// Two chunks that each wait for the other: only two threads at once can
// finish them. Run with parked workers (spin 0) too: they must wake.
TEST(ComputePoolTest, WorkersRunChunksAlongsideTheCaller) {
  for (const microseconds spin : {microseconds(0), microseconds(500)}) {
    ComputePool pool(1, spin);
    for (int job = 0; job < 20; ++job) {
      std::atomic<int> arrived{0};
      std::atomic<int> met{0};
      auto f = [&](int64_t) {
        arrived.fetch_add(1);
        if (AwaitCount(arrived, 2)) met.fetch_add(1);
      };
      RunJob(pool, 2, f);
      EXPECT_EQ(met.load(), 2) << "spin " << spin.count() << " job " << job;
      std::this_thread::sleep_for(milliseconds(2));  // let the worker park
    }
  }
}

// The first chunk a worker takes stalls; a static split would leave half
// the chunks behind it, dynamic claiming lets the caller take the rest.
TEST(ComputePoolTest, ALateWorkerOnlyTakesFewerChunks) {
  ComputePool pool(1, microseconds(1000));
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int> by_caller{0}, by_worker{0};
  auto f = [&](int64_t) {
    if (std::this_thread::get_id() == caller) {
      by_caller.fetch_add(1);
      std::this_thread::sleep_for(microseconds(100));
    } else if (by_worker.fetch_add(1) == 0) {
      std::this_thread::sleep_for(milliseconds(300));
    }
  };
  RunJob(pool, 100, f);
  EXPECT_EQ(by_caller.load() + by_worker.load(), 100);
  EXPECT_GE(by_caller.load(), 90);
}

TEST(ComputePoolTest, NestedAndConcurrentJobsRunInline) {
  ComputePool pool(2, microseconds(100));
  std::atomic<int64_t> total{0};
  auto inner = [&](int64_t c) { total.fetch_add(c + 1); };
  auto outer = [&](int64_t) { RunJob(pool, 10, inner); };  // nested
  std::thread other([&] {
    for (int i = 0; i < 200; ++i) RunJob(pool, 8, outer);
  });
  for (int i = 0; i < 200; ++i) RunJob(pool, 8, outer);
  other.join();
  EXPECT_EQ(total.load(), int64_t{2} * 200 * 8 * 55);
}

TEST(ParallelForTest, CoversTheRangeOnceOnGrainBoundaries) {
  const int saved = NumThreads();
  for (const int threads : {1, 2, 3}) {
    SetNumThreads(threads);
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{64}, int64_t{1000},
                            int64_t{100003}}) {
      for (const int64_t grain : {int64_t{1}, int64_t{4}, int64_t{1024}}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        ParallelFor(n, grain, [&](int64_t lo, int64_t hi) {
          EXPECT_EQ(lo % grain, 0);
          EXPECT_TRUE(hi == n || hi % grain == 0);
          for (int64_t i = lo; i < hi; ++i) seen[static_cast<size_t>(i)] += 1;
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1)
              << "threads " << threads << " n " << n << " grain " << grain;
        }
      }
      std::vector<std::atomic<int>> each(static_cast<size_t>(n));
      ParallelForEach(n, [&](int64_t i) { each[static_cast<size_t>(i)] += 1; });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(each[static_cast<size_t>(i)].load(), 1) << "n " << n;
      }
    }
  }
  SetNumThreads(saved);
}

}  // namespace
}  // namespace kvserve
