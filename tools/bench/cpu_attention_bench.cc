// The CPU paged attention kernel (models/cpu/paged_attention.h) on the
// default model's attention shape (9 query / 3 KV heads, head_dim 64,
// block 16 (32 for int3/int2), 30 layers): the attention of one step over all
// layers, for the decode of `seqs` sequences of `context` keys and for one
// prefill chunk of `chunk` query tokens at the end of `context` keys, per KV
// dtype. Each layer has its own pages, so from 4K keys on the cache outgrows
// the L3 as in a real model. Items/s counts attended (query token, key) pairs
// per KV head and layer, so figures compare across contexts.
//
//   build/tools/cpu_attention_bench --benchmark_filter=Decode
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/page_buffer.h"
#include "kvcache/kv_sizing.h"
#include "models/cpu/kv_rows.h"
#include "models/cpu/paged_attention.h"
#include "models/forward_batch.h"
#include "models/kv_view.h"

namespace kvserve::models {
namespace {

using kvcache::KvDtype;

constexpr int kHeads = 9, kKvHeads = 3, kDim = 64, kBlock = 16, kLayers = 30;

// Random K/V for `seqs` sequences of `context` keys each, on shuffled
// blocks, and the batch whose last `chunk` tokens of each sequence query.
struct Setup {
  PageBuffer k_buf, v_buf;  // as the engine's pool allocates its planes
  std::byte *k = nullptr, *v = nullptr;
  KvCacheView view;
  ForwardBatch batch;
  std::vector<float> q, out;

  Setup(KvDtype dtype, int seqs, int context, int chunk, int layers,
        bool shuffle) {
    // int3/int2 need blocks of whole key groups (32 tokens).
    const int32_t bs = kvcache::KvDtypeDefaultBlockSize(dtype, kBlock);
    const int32_t per_seq = (context + bs - 1) / bs;
    const int32_t blocks = per_seq * seqs;
    const int64_t row = kvcache::KvRowBytes(dtype, kDim);
    const int64_t slots = static_cast<int64_t>(blocks) * bs;
    const int64_t plane = slots * kKvHeads * row;
    k_buf = *PageBuffer::Reserve(plane * layers, "bench K");
    v_buf = *PageBuffer::Reserve(plane * layers, "bench V");
    k = reinterpret_cast<std::byte*>(k_buf.data());
    v = reinterpret_cast<std::byte*>(v_buf.data());
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(kDim);
    for (int64_t r = 0; r < slots * kKvHeads; ++r) {
      for (float& e : x) e = u(rng);
      cpu::EncodeKvRow(dtype, x.data(), kDim, k + r * row);
      for (float& e : x) e = u(rng);
      cpu::EncodeKvRow(dtype, x.data(), kDim, v + r * row);
    }
    view = {blocks, bs, kKvHeads, kDim, dtype, {}, {}};
    for (int l = 0; l < layers; ++l) {  // the same contents on every layer
      if (l > 0) {
        std::copy_n(k, plane, k + l * plane);
        std::copy_n(v, plane, v + l * plane);
      }
      view.k.push_back(k + l * plane);
      view.v.push_back(v + l * plane);
    }
    std::vector<int32_t> perm(blocks);
    std::iota(perm.begin(), perm.end(), 0);
    if (shuffle) std::shuffle(perm.begin(), perm.end(), rng);
    batch.block_tables = perm;
    batch.max_blocks_per_seq = per_seq;
    batch.seq_starts.push_back(0);
    for (int s = 0; s < seqs; ++s) {
      for (int i = context - chunk; i < context; ++i) {
        batch.token_ids.push_back(1);
        batch.positions.push_back(i);
        batch.slot_mapping.push_back(0);
      }
      batch.seq_starts.push_back(batch.num_tokens());
      batch.context_lens.push_back(context);
    }
    q.resize(static_cast<size_t>(batch.num_tokens()) * kHeads * kDim);
    for (float& e : q) e = u(rng);
    out.resize(q.size());
  }
};

// Runs kLayers layers per iteration over `copies` x `layers` distinct
// layers of pages, in turn (layer l reads pages l % layers): copies > 1
// keeps the pages out of a large L3 (a 30-layer 4K fp16 cache is 94 MB;
// some hosts report 480 MB of L3), as in a real forward, where the weights
// stream through between layers; layers < kLayers keeps them in L2.
// `shuffle` scatters the blocks; otherwise they are in id order.
void Run(benchmark::State& state, int seqs, int chunk, int copies = 1,
         bool shuffle = true, int layers = kLayers) {
  const auto dtype = static_cast<KvDtype>(state.range(0));
  const int context = static_cast<int>(state.range(1));
  Setup s(dtype, seqs, context, chunk, layers * copies, shuffle);
  const AttentionParams p{kHeads, kKvHeads, kDim,
                          1.0f / std::sqrt(static_cast<float>(kDim)), 0};
  int copy = 0;
  for (auto _ : state) {
    for (int l = 0; l < kLayers; ++l) {
      PagedAttention(p, s.batch, s.q.data(), nullptr, kHeads * kDim, s.view,
                     copy * layers + l % layers, s.out.data());
    }
    copy = (copy + 1) % copies;
    benchmark::DoNotOptimize(s.out.data());
  }
  // Attended (token, key) pairs per KV head: causal within the chunk.
  const double pairs = static_cast<double>(seqs) * chunk *
                       (context - chunk + (chunk + 1) / 2.0) * kKvHeads *
                       kLayers;
  state.SetItemsProcessed(static_cast<int64_t>(pairs) * state.iterations());
  state.SetLabel(std::string(kvcache::KvDtypeName(dtype)));
}

void BM_Decode(benchmark::State& state) { Run(state, 1, 1); }
void BM_Decode4(benchmark::State& state) { Run(state, 4, 1); }
void BM_DecodeCold(benchmark::State& state) { Run(state, 1, 1, 6); }
// One layer's pages attended kLayers times: at 4K they stay in the cores'
// L2, so this is the kernel's arithmetic with little waiting on memory.
void BM_DecodeHot(benchmark::State& state) {
  Run(state, 1, 1, /*copies=*/1, /*shuffle=*/true, /*layers=*/1);
}
// Blocks in id order, as a fresh pool hands them to one sequence: each
// layer's pages are one run of memory.
void BM_DecodeColdSeq(benchmark::State& state) {
  Run(state, 1, 1, /*copies=*/6, /*shuffle=*/false);
}
void BM_Prefill(benchmark::State& state) { Run(state, 1, 256); }

void DtypeArgs(benchmark::internal::Benchmark* b,
               std::initializer_list<int64_t> contexts) {
  // int3/int2 keys are written as value rows here: the kernel's reads
  // (codes, then each group's scales) cost the same whatever the bytes.
  for (KvDtype d :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8,
        KvDtype::kInt4, KvDtype::kInt3, KvDtype::kInt2}) {
    for (int64_t c : contexts) b->Args({static_cast<int64_t>(d), c});
  }
}

BENCHMARK(BM_Decode)->Apply([](benchmark::internal::Benchmark* b) {
  DtypeArgs(b, {256, 4096, 16384});
});
BENCHMARK(BM_DecodeCold)->Apply([](benchmark::internal::Benchmark* b) {
  DtypeArgs(b, {4096});
});
BENCHMARK(BM_DecodeHot)->Apply([](benchmark::internal::Benchmark* b) {
  DtypeArgs(b, {4096});
});
BENCHMARK(BM_DecodeColdSeq)->Apply([](benchmark::internal::Benchmark* b) {
  DtypeArgs(b, {4096});
});
BENCHMARK(BM_Decode4)->Apply([](benchmark::internal::Benchmark* b) {
  DtypeArgs(b, {4096});
});
BENCHMARK(BM_Prefill)->Apply([](benchmark::internal::Benchmark* b) {
  DtypeArgs(b, {256, 4096});
});

}  // namespace
}  // namespace kvserve::models

BENCHMARK_MAIN();
