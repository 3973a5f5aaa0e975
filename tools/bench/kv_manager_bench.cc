// KV cache manager cost per block at 1K, 64K and 1M blocks: the bookkeeping
// must cost the same per block whatever the pool size (O(1) free-queue pops
// and pushes, O(1) hash lookups), so compare ns_per_block across sizes.
//
//   BM_Allocate/N     Allocate of a 64-block table (pops from the free-queue
//                     head; evicts LRU cached blocks when they are there)
//   BM_Free/N         Free of a 64-block table (tail-first pushes)
//   BM_PrefixMatch/N  FindCachedPrefix of a 64-block cached prompt (hash,
//                     lookup and token compare per block)
//
// Half of each pool holds evictable cached blocks, so the hash map has N/2
// entries and the free queue mixes cached and plain blocks. Only the
// measured call is timed (manual time); ns_per_block = its total / blocks.
#include <chrono>
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
const BlockHash kNs = NamespaceHash("bench-model", "");

std::vector<int32_t> Prompt(int32_t seed, int32_t blocks) {
  std::vector<int32_t> v(static_cast<size_t>(blocks) * kBlockSize + 1);
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<int32_t>((seed * 7919 + i * 31) % 32000);
  }
  return v;
}

// A pool of `num_blocks` whose first half is cached and evictable, plus the
// cached 64-block prompt `hot` (kept cached by a live holder, request -1).
struct Pool {
  explicit Pool(int32_t num_blocks) : kv(num_blocks, kBlockSize) {
    const int32_t fill = num_blocks / 2 / kTableBlocks;
    for (int32_t i = 0; i < fill; ++i) Cache(i + 1, Prompt(i + 1, kTableBlocks));
    for (int32_t i = 0; i < fill; ++i) kv.Free(i + 1);  // -> evictable
    hot = Prompt(0, kTableBlocks);
    Cache(-1, hot);
  }
  void Cache(RequestId id, const std::vector<int32_t>& tokens) {
    const TokenSequence seq{tokens, {}};
    KV_CHECK(kv.Allocate(id, seq.size() - 1).has_value(), "fill");
    kv.CacheComputedBlocks(id, seq, seq.size() - 1, kNs);
  }
  KvCacheManager kv;
  std::vector<int32_t> hot;
};

double Seconds(std::chrono::steady_clock::time_point a,
               std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Report(benchmark::State& state, double total_s, int64_t blocks) {
  state.counters["ns_per_block"] = total_s * 1e9 / static_cast<double>(blocks);
  state.counters["pool_blocks"] = static_cast<double>(state.range(0));
}

void BM_Allocate(benchmark::State& state) {
  Pool pool(static_cast<int32_t>(state.range(0)));
  double total = 0;
  int64_t blocks = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto fresh = pool.kv.Allocate(1 << 30, int64_t{kTableBlocks} * kBlockSize);
    const auto t1 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(fresh);
    pool.kv.Free(1 << 30);
    state.SetIterationTime(Seconds(t0, t1));
    total += Seconds(t0, t1);
    blocks += kTableBlocks;
  }
  Report(state, total, blocks);
}

void BM_Free(benchmark::State& state) {
  Pool pool(static_cast<int32_t>(state.range(0)));
  double total = 0;
  int64_t blocks = 0;
  for (auto _ : state) {
    KV_CHECK(pool.kv.Allocate(1 << 30, int64_t{kTableBlocks} * kBlockSize)
                 .has_value());
    const auto t0 = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(pool.kv.Free(1 << 30));
    const auto t1 = std::chrono::steady_clock::now();
    state.SetIterationTime(Seconds(t0, t1));
    total += Seconds(t0, t1);
    blocks += kTableBlocks;
  }
  Report(state, total, blocks);
}

void BM_PrefixMatch(benchmark::State& state) {
  Pool pool(static_cast<int32_t>(state.range(0)));
  const TokenSequence seq{pool.hot, {}};
  double total = 0;
  int64_t blocks = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    const PrefixMatch m = pool.kv.FindCachedPrefix(seq, kNs);
    const auto t1 = std::chrono::steady_clock::now();
    KV_CHECK(m.blocks.size() == kTableBlocks, "matched ", m.blocks.size());
    state.SetIterationTime(Seconds(t0, t1));
    total += Seconds(t0, t1);
    blocks += kTableBlocks;
  }
  Report(state, total, blocks);
}

#define KV_SIZES ->Arg(1 << 10)->Arg(64 << 10)->Arg(1 << 20)
BENCHMARK(BM_Allocate) KV_SIZES->UseManualTime();
BENCHMARK(BM_Free) KV_SIZES->UseManualTime();
BENCHMARK(BM_PrefixMatch) KV_SIZES->UseManualTime();

}  // namespace
}  // namespace kvserve::kvcache

BENCHMARK_MAIN();
