// KV cache manager cost per block at 1K, 64K and 1M blocks: the bookkeeping
// must cost the same per block whatever the pool size (O(1) free-queue pops
// and pushes, O(1) hash lookups), so compare ns_per_block across sizes.
//
//   BM_Allocate/N       Allocate of 8 tables of 64 blocks from plain free
//                       blocks (free-queue head pops)
//   BM_AllocateEvict/N  the same from a pool that is all cached-evictable:
//                       every block popped is evicted (lazy deletion: no
//                       hash map access). Counter recache_ns_per_block:
//                       CacheComputedBlocks of the evicted blocks with new
//                       content (hash, map insert, and the erase of each
//                       block's stale entry that eviction skipped)
//   BM_Free/N           Free of 8 tables of 64 blocks (tail-first pushes)
//   BM_PrefixMatch/N    8 x FindCachedPrefix of a 64-block cached prompt
//                       (hash, lookup and token compare per block) with
//                       half of the pool cached (an N/2-entry hash map)
//
// Only the measured calls are timed, in thread CPU time (manual time): the
// build machine is shared, and CPU time is what the engine thread pays.
// ns_per_block = timed total / blocks.
#include <time.h>

#include <memory>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/check.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_cache_manager.h"

namespace kvserve::kvcache {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kTableBlocks = 64;
constexpr int32_t kBatch = 8;  // tables per timed region
const BlockHash kNs = NamespaceHash("bench-model", "");

// 64 blocks + 1 token; the first token makes the whole chain unique.
std::vector<int32_t> Prompt(int64_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(kTableBlocks) * kBlockSize + 1);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<int32_t>((i * 31) % 32000);
  }
  v[0] = static_cast<int32_t>(seed);
  return v;
}

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// A pool of `num_blocks` with `cached_tables` evictable cached 64-block
// prompts and, when `hot`, one more cached prompt kept by a live holder.
struct Pool {
  Pool(int32_t num_blocks, int32_t cached_tables, bool with_hot)
      : kv(num_blocks, kBlockSize) {
    for (int32_t i = 0; i < cached_tables; ++i) Cache(i + 1, NextSeed());
    for (int32_t i = 0; i < cached_tables; ++i) kv.Free(i + 1);
    if (with_hot) {
      hot = Prompt(0);
      Cache(-1, 0);
    }
  }
  int64_t NextSeed() { return ++seed; }
  // Gives `id` a 64-block table holding prompt `seed`, registered.
  void Cache(RequestId id, int64_t prompt_seed) {
    const std::vector<int32_t> tokens = Prompt(prompt_seed);
    const TokenSequence seq{tokens, {}};
    KV_CHECK(kv.Allocate(id, seq.size() - 1).has_value(), "fill");
    kv.CacheComputedBlocks(id, seq, seq.size() - 1, kNs);
  }
  KvCacheManager kv;
  std::vector<int32_t> hot;
  int64_t seed = 1000;
};

constexpr RequestId kWorkId = 1 << 30;

void Report(benchmark::State& state, double total_s) {
  const double blocks =
      static_cast<double>(state.iterations()) * kBatch * kTableBlocks;
  state.counters["ns_per_block"] = total_s * 1e9 / blocks;
}

void AllocateBatch(Pool& pool) {
  for (int32_t t = 0; t < kBatch; ++t) {
    auto fresh =
        pool.kv.Allocate(kWorkId + t, int64_t{kTableBlocks} * kBlockSize);
    benchmark::DoNotOptimize(fresh);
  }
}

void BM_Allocate(benchmark::State& state) {
  Pool pool(static_cast<int32_t>(state.range(0)), 0, false);
  double total = 0;
  for (auto _ : state) {
    const double t0 = ThreadSeconds();
    AllocateBatch(pool);
    const double dt = ThreadSeconds() - t0;
    for (int32_t t = 0; t < kBatch; ++t) pool.kv.Free(kWorkId + t);
    state.SetIterationTime(dt);
    total += dt;
  }
  Report(state, total);
}

void BM_AllocateEvict(benchmark::State& state) {
  const auto n = static_cast<int32_t>(state.range(0));
  Pool pool(n, n / kTableBlocks, false);
  KV_CHECK(pool.kv.Usage().cached_evictable_blocks == n, "not all cached");
  double total = 0, recache = 0;
  std::vector<std::vector<int32_t>> tokens(kBatch);
  for (auto _ : state) {
    const double t0 = ThreadSeconds();
    AllocateBatch(pool);
    const double dt = ThreadSeconds() - t0;
    // Not in the main timing: register fresh content and free it: cached
    // again at the tail. The registration alone is recache_ns_per_block.
    for (int32_t t = 0; t < kBatch; ++t) tokens[t] = Prompt(pool.NextSeed());
    const double t1 = ThreadSeconds();
    for (int32_t t = 0; t < kBatch; ++t) {
      pool.kv.CacheComputedBlocks(kWorkId + t, TokenSequence{tokens[t], {}},
                                  kTableBlocks * kBlockSize, kNs);
    }
    recache += ThreadSeconds() - t1;
    for (int32_t t = 0; t < kBatch; ++t) pool.kv.Free(kWorkId + t);
    state.SetIterationTime(dt);
    total += dt;
  }
  KV_CHECK(pool.kv.Usage().cached_evictable_blocks == n, "drifted");
  Report(state, total);
  state.counters["recache_ns_per_block"] =
      recache * 1e9 /
      (static_cast<double>(state.iterations()) * kBatch * kTableBlocks);
}

void BM_Free(benchmark::State& state) {
  Pool pool(static_cast<int32_t>(state.range(0)), 0, false);
  double total = 0;
  for (auto _ : state) {
    AllocateBatch(pool);
    const double t0 = ThreadSeconds();
    for (int32_t t = 0; t < kBatch; ++t) {
      benchmark::DoNotOptimize(pool.kv.Free(kWorkId + t));
    }
    const double dt = ThreadSeconds() - t0;
    state.SetIterationTime(dt);
    total += dt;
  }
  Report(state, total);
}

void BM_PrefixMatch(benchmark::State& state) {
  const auto n = static_cast<int32_t>(state.range(0));
  Pool pool(n, n / 2 / kTableBlocks, true);
  const TokenSequence seq{pool.hot, {}};
  double total = 0;
  for (auto _ : state) {
    const double t0 = ThreadSeconds();
    for (int32_t t = 0; t < kBatch; ++t) {
      const PrefixMatch m = pool.kv.FindCachedPrefix(seq, kNs);
      KV_CHECK(m.blocks.size() == kTableBlocks, "matched ", m.blocks.size());
    }
    const double dt = ThreadSeconds() - t0;
    state.SetIterationTime(dt);
    total += dt;
  }
  Report(state, total);
}

#define KV_SIZES ->Arg(1 << 10)->Arg(64 << 10)->Arg(1 << 20)
BENCHMARK(BM_Allocate) KV_SIZES->UseManualTime();
BENCHMARK(BM_AllocateEvict) KV_SIZES->UseManualTime();
BENCHMARK(BM_Free) KV_SIZES->UseManualTime();
BENCHMARK(BM_PrefixMatch) KV_SIZES->UseManualTime();

}  // namespace
}  // namespace kvserve::kvcache

BENCHMARK_MAIN();
