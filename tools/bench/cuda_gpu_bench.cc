// Device benchmark of the CUDA backend (run by tools/device_bench.sh on a
// GPU machine; prints a notice and exits 0 without a device):
//   1. device copy bandwidth: large cudaMemcpy D2D, bytes read + written;
//   2. decode paged attention, D=128, block 16, Llama-3-8B (32 q / 8 kv
//      heads) and Llama-3-70B (64 q / 8 kv) head shapes, batch 1..256,
//      context 512..32K: achieved GB/s (K + V + q + out bytes) and its
//      fraction of (1);
//   3. end-to-end decode tokens/s at batch 1 and 64 with random weights at
//      the Llama-3-8B shape, against the floor of reading the weights and
//      the KV once per step at the bandwidth of (1).
// Each timing: warm-up, then the median of repeated runs timed with events
// (attention: every repetition uses different random blocks of a pool far
// larger than L2). Prints markdown tables; --json PATH writes every figure.
//   cuda_gpu_bench [--json PATH] [--quick]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#ifdef KVSERVE_CUDA
#include <cuda_runtime.h>

#include "models/cuda/cuda_llama.h"
#include "models/cuda/kernels.h"
#include "nlohmann/json.hpp"
#include "tools/bench/gpu_timing.h"

namespace kvserve::models::cuda {
namespace {

#define BENCH_CHECK GPU_BENCH_CHECK

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double CopyBandwidth(nlohmann::json* out) {
  const size_t bytes = size_t{4} << 30;
  const double bw = gpu_bench::CopyBandwidth(bytes);
  const double t = 2.0 * bytes / bw;
  (*out)["copy"] = {{"bytes", bytes}, {"seconds", t}, {"bytes_per_s", bw}};
  std::printf(
      "## Device copy bandwidth\n\n%.0f GB/s (cudaMemcpy D2D of %zu "
      "MiB, read + write)\n\n",
      bw / 1e9, bytes >> 20);
  return bw;
}

struct HeadShape {
  const char* name;
  int h, hkv;
};

void AttentionBench(double copy_bw, bool quick, nlohmann::json* out) {
  const int d = 128, bs = 16;
  const std::vector<HeadShape> shapes = {{"Llama-3-8B", 32, 8},
                                         {"Llama-3-70B", 64, 8}};
  const std::vector<int> batches =
      quick ? std::vector<int>{1, 64}
            : std::vector<int>{1, 8, 32, 64, 128, 256};
  const std::vector<int> contexts =
      quick ? std::vector<int>{512, 4096}
            : std::vector<int>{512, 1024, 2048, 4096, 8192, 16384, 32768};
  // One pool of blocks, larger than the biggest case and far larger than L2.
  const int64_t slot = 8LL * d;  // kv heads * D
  const int64_t pool_blocks = 256LL * 32768 / bs + 4096;
  const int64_t pool_elems = pool_blocks * bs * slot;
  bf16 *kc = nullptr, *vc = nullptr;
  BENCH_CHECK(cudaMalloc(&kc, pool_elems * 2));
  BENCH_CHECK(cudaMalloc(&vc, pool_elems * 2));
  BENCH_CHECK(FillRandomBf16(kc, pool_elems, 2, 1.0f, nullptr));
  BENCH_CHECK(FillRandomBf16(vc, pool_elems, 3, 1.0f, nullptr));
  int sms = 1, dev = 0;
  BENCH_CHECK(cudaGetDevice(&dev));
  BENCH_CHECK(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  std::mt19937 rng(7);
  std::printf(
      "## Decode paged attention (D=128, block 16, bf16 KV)\n\n"
      "| model heads | batch | context | splits | us | GB/s | of copy BW |\n"
      "|---|---|---|---|---|---|---|\n");
  nlohmann::json rows = nlohmann::json::array();
  constexpr int kReps = 20, kWarm = 3, kCalls = 5, kSets = 23;
  for (const HeadShape& hs : shapes) {
    for (int batch : batches) {
      for (int ctx : contexts) {
        const int mb = (ctx + bs - 1) / bs;
        const int64_t q_stride = (hs.h + 2 * hs.hkv) * d;
        std::vector<int32_t> starts(batch + 1), lens(batch, ctx);
        std::iota(starts.begin(), starts.end(), 0);
        const AttnShape shape{hs.h,
                              hs.hkv,
                              d,
                              bs,
                              mb,
                              0,
                              1.0f / std::sqrt(static_cast<float>(d))};
        const AttnPlan plan =
            PlanAttention(shape, starts.data(), lens.data(), batch, sms);
        // kSets block-table sets, each drawn at random from the whole pool.
        std::vector<int32_t> tables(static_cast<size_t>(kSets) * batch * mb);
        for (int64_t i = 0; i < static_cast<int64_t>(tables.size()); ++i) {
          tables[i] = static_cast<int32_t>(rng() % pool_blocks);
        }
        int32_t* dt = nullptr;
        AttnWorkItem* items = nullptr;
        float *q = nullptr, *scratch = nullptr;
        bf16* o = nullptr;
        BENCH_CHECK(cudaMalloc(&dt, tables.size() * 4));
        BENCH_CHECK(cudaMemcpy(dt, tables.data(), tables.size() * 4,
                               cudaMemcpyHostToDevice));
        BENCH_CHECK(
            cudaMalloc(&items, plan.small.size() * sizeof(AttnWorkItem) + 16));
        BENCH_CHECK(cudaMemcpy(items, plan.small.data(),
                               plan.small.size() * sizeof(AttnWorkItem),
                               cudaMemcpyHostToDevice));
        AttnWorkItem* tiles = nullptr;
        BENCH_CHECK(
            cudaMalloc(&tiles, plan.tiles.size() * sizeof(AttnWorkItem) + 16));
        BENCH_CHECK(cudaMemcpy(tiles, plan.tiles.data(),
                               plan.tiles.size() * sizeof(AttnWorkItem),
                               cudaMemcpyHostToDevice));
        BENCH_CHECK(cudaMalloc(&q, batch * q_stride * 4));
        BENCH_CHECK(cudaMemset(q, 0x3c, batch * q_stride * 4));  // ~0.01
        BENCH_CHECK(cudaMalloc(&scratch, AttnScratchFloats(shape, sms) * 4));
        BENCH_CHECK(cudaMalloc(&o, batch * hs.h * d * 2));
        // kCalls back-to-back calls per timing: the launch gap of the
        // first stays out of the per-call figure.
        const double t =
            gpu_bench::MedianSecondsPerCall(kWarm, kReps, kCalls, [&](int i) {
              BENCH_CHECK(PagedAttention(
                  shape, plan, items, tiles, q, q_stride, kc, vc,
                  dt + static_cast<int64_t>(i % kSets) * batch * mb, scratch, o,
                  nullptr));
            });
        BENCH_CHECK(cudaGetLastError());
        const double bytes = 2.0 * batch * ctx * slot * 2 +
                             batch * hs.h * d * (4.0 + 2.0) +
                             batch * static_cast<double>(mb) * 4;
        const double bw = bytes / t;
        const int splits =
            plan.small.empty() ? plan.tile_splits : plan.small_splits;
        std::printf("| %s %d/%d | %d | %d | %d | %.1f | %.0f | %.2f |\n",
                    hs.name, hs.h, hs.hkv, batch, ctx, splits, t * 1e6,
                    bw / 1e9, bw / copy_bw);
        rows.push_back({{"shape", hs.name},
                        {"num_heads", hs.h},
                        {"num_kv_heads", hs.hkv},
                        {"batch", batch},
                        {"context", ctx},
                        {"splits", splits},
                        {"seconds", t},
                        {"bytes", bytes},
                        {"bytes_per_s", bw},
                        {"fraction_of_copy", bw / copy_bw}});
        BENCH_CHECK(cudaFree(dt));
        BENCH_CHECK(cudaFree(items));
        BENCH_CHECK(cudaFree(tiles));
        BENCH_CHECK(cudaFree(q));
        BENCH_CHECK(cudaFree(scratch));
        BENCH_CHECK(cudaFree(o));
      }
    }
  }
  BENCH_CHECK(cudaFree(kc));
  BENCH_CHECK(cudaFree(vc));
  (*out)["decode_attention"] = rows;
  std::printf("\n");
}

ModelConfig Llama3_8B() {
  ModelConfig c;
  c.name = "llama-3-8b-random";
  c.architecture = "llama";
  c.num_layers = 32;
  c.hidden_size = 4096;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 14336;
  c.vocab_size = 128256;
  c.max_position = 131072;
  c.rope_theta = 500000.0f;
  c.rope_style = RopeStyle::kHalfSplit;
  return c;
}

// Median seconds per Forward of `b` after 3 warm-up steps (5 or 20 timed).
double SecondsPerStep(CudaLlamaModel& m, const ForwardBatch& b,
                      const CudaKvCache& cache, bool quick) {
  ForwardOutput out;
  std::vector<double> t;
  for (int i = 0; i < (quick ? 8 : 23); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status st = m.Forward(b, cache, &out);
    if (!st.ok()) {
      std::fprintf(stderr, "Forward: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    if (i >= 3) {
      t.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count());
    }
  }
  return Median(t);
}

void EndToEndBench(double copy_bw, bool quick, nlohmann::json* out) {
  const ModelConfig c = Llama3_8B();
  auto model = CudaLlamaModel::CreateRandom(c, 11);
  if (!model.ok()) {
    std::fprintf(stderr, "CreateRandom: %s\n",
                 model.status().ToString().c_str());
    std::exit(1);
  }
  CudaLlamaModel& m = **model;
  const int bs = 16;
  const std::vector<int> batches = {1, 64};
  const std::vector<int> contexts =
      quick ? std::vector<int>{1024} : std::vector<int>{1024, 4096};
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int mb = (max_ctx + bs - 1) / bs;
  const int num_blocks = 64 * mb;
  DeviceBuffer kv;
  const int64_t plane = static_cast<int64_t>(num_blocks) * m.BlockElems(bs);
  if (!kv.Allocate(2LL * c.num_layers * plane * 2, "bench KV").ok()) {
    std::fprintf(stderr, "KV allocation failed\n");
    std::exit(1);
  }
  BENCH_CHECK(FillRandomBf16(kv.as<bf16>(), 2LL * c.num_layers * plane, 5, 1.0f,
                             nullptr));
  BENCH_CHECK(cudaDeviceSynchronize());
  const CudaKvCache cache{num_blocks, bs, kv.as<void>(), plane * 2};
  std::printf(
      "## End-to-end decode, random weights, Llama-3-8B shape (bf16)\n\n"
      "ms/step: with every logits row copied to the host, then with only "
      "the\ndevice argmax of each row (greedy); tokens/s and floor / measured "
      "are\nthe greedy one's.\n\n"
      "| batch | context | ms/step (logits) | ms/step (argmax) | tokens/s | "
      "floor ms | floor / measured |\n"
      "|---|---|---|---|---|---|---|\n");
  nlohmann::json rows = nlohmann::json::array();
  for (int batch : batches) {
    for (int ctx : contexts) {
      ForwardBatch b;
      b.max_blocks_per_seq = mb;
      b.seq_starts = {0};
      for (int s = 0; s < batch; ++s) {
        const int pos = ctx - 1;
        b.token_ids.push_back((s * 7919) % c.vocab_size);
        b.positions.push_back(pos);
        b.slot_mapping.push_back((s * mb + pos / bs) * bs + pos % bs);
        b.seq_starts.push_back(s + 1);
        b.context_lens.push_back(ctx);
        for (int j = 0; j < mb; ++j) b.block_tables.push_back(s * mb + j);
        b.logits_rows.push_back(s);
      }
      // Whole logits rows to the host (sampling on the CPU), then only the
      // device argmax of each row (greedy: what the server does for greedy
      // requests without logprobs or penalties).
      const double full = SecondsPerStep(m, b, cache, quick);
      b.argmax_only.assign(b.logits_rows.size(), 1);
      const double step = SecondsPerStep(m, b, cache, quick);
      const double kv_bytes =
          2.0 * batch * ctx * c.num_layers * c.num_kv_heads * c.head_dim * 2;
      const double floor = (m.weight_bytes() + kv_bytes) / copy_bw;
      std::printf("| %d | %d | %.2f | %.2f | %.0f | %.2f | %.2f |\n", batch,
                  ctx, full * 1e3, step * 1e3, batch / step, floor * 1e3,
                  floor / step);
      rows.push_back({{"batch", batch},
                      {"context", ctx},
                      {"seconds_per_step_full_logits", full},
                      {"seconds_per_step", step},
                      {"tokens_per_s", batch / step},
                      {"weight_bytes", m.weight_bytes()},
                      {"kv_bytes", kv_bytes},
                      {"floor_seconds", floor},
                      {"floor_over_measured", floor / step}});
    }
  }
  (*out)["end_to_end_decode"] = rows;
}

int Main(int argc, char** argv) {
  std::string json_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (!gpu_bench::HaveDeviceOrExplain("cuda_gpu_bench")) return 0;
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# kvserve CUDA benchmark on %s (%d SMs, %.0f GiB)\n\n",
              prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0);
  nlohmann::json out;
  out["device"] = prop.name;
  out["sms"] = prop.multiProcessorCount;
  const double bw = CopyBandwidth(&out);
  AttentionBench(bw, quick, &out);
  EndToEndBench(bw, quick, &out);
  if (!json_path.empty()) {
    std::ofstream(json_path) << out.dump(2) << "\n";
    std::printf("\nwrote %s\n", json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace kvserve::models::cuda

int main(int argc, char** argv) {
  return kvserve::models::cuda::Main(argc, argv);
}

#else  // !KVSERVE_CUDA

int main() {
  std::printf("cuda_gpu_bench: built without CUDA (KVSERVE_CUDA=OFF)\n");
  return 0;
}

#endif  // KVSERVE_CUDA
