// The machine's read bandwidth, STREAM-like: a buffer read whole on the
// compute pool (the threads the kernels use), summed so that no load is
// dead. Decode at batch 1 is bound by it: a step reads the weights once,
// so weights bytes / time per token over this figure is the share of the
// machine a decode step reaches.
//
//   BM_Read/<MiB>/<threads>
//
// Report bytes_per_second. Buffers of at least 4x the last-level cache
// measure memory; smaller ones measure the cache (lscpu says its size; a
// VM may report the host's).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/parallel.h"

namespace kvserve {
namespace {

// Sum of `n` words from `p`, in eight independent lanes so that the adds do
// not chain; the caller reads it so that the loads stay.
uint64_t SumWords(const uint64_t* p, int64_t n) {
  uint64_t lane[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += p[i + k];
  }
  for (; i < n; ++i) lane[0] += p[i];
  uint64_t sum = 0;
  for (const uint64_t v : lane) sum += v;
  return sum;
}

void BM_Read(benchmark::State& state) {
  const int64_t words = state.range(0) * (int64_t{1} << 20) / 8;
  SetNumThreads(static_cast<int>(state.range(1)));
  std::vector<uint64_t> buf(static_cast<size_t>(words));
  for (int64_t i = 0; i < words; ++i) buf[i] = static_cast<uint64_t>(i);
  constexpr int64_t kGrain = 1 << 16;  // 512 KiB per chunk
  std::vector<uint64_t> partial(static_cast<size_t>(words / kGrain + 1));
  for (auto _ : state) {
    ParallelFor(words, kGrain, [&](int64_t lo, int64_t hi) {
      partial[lo / kGrain] = SumWords(buf.data() + lo, hi - lo);
    });
    benchmark::DoNotOptimize(partial.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * words * 8);
  SetNumThreads(0);
}

BENCHMARK(BM_Read)
    ->ArgsProduct({{256, 1024, 4096}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace kvserve

BENCHMARK_MAIN();
