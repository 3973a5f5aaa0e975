// CPU GEMM path benchmarks: both kernel families on the SmolLM2-135M
// linear-layer shapes and a 4096x4096 one, m = 1, 8, 64, 512, so choices are
// made on same-run ratios; plus whole-model sweeps (30 layers + output head,
// distinct weights, so caches behave as in a real forward).
//
//   Matmul/<type>/<rows>x<cols>/m:<m>/<path>   counters: best_us = fastest
//       iteration; GBps = weight bytes the path streams / best_us (read at
//       m=1); GFLOPs = 2 m rows cols / best_us.
//   DecodeSweep/<path>/m:<m>   one forward's matmuls: best_ms per call = per
//       token at m=1; PrefillSweep likewise for prefill chunks.
//   ShapeSweep/<shape>/<type>/m:1   the matmuls of a Llama-3.2-1B or -3B
//       shape's layers in one type, distinct weights (0.5-3 GiB: out of any
//       cache), at batch 1: GiBps = GGUF bytes / best time, to set beside
//       memory_bandwidth_bench's read rate (the decode kernels' ceiling).
//
// NOTE: counters use the fastest iteration, not the mean: the build machine
// is shared, and interference only ever adds time. Run with
// --benchmark_enable_random_interleaving=true --benchmark_repetitions=N so
// that candidates are sampled alternately.
//
// Paths: int8_vnni (quantized types) and own_float (own AVX-512 fp32 kernel;
// on dequantized fp32 weights for quantized types).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "models/cpu/matmul.h"
#include "models/ggml_types.h"
#include "models/quant_blocks.h"

namespace kvserve::models::cpu {
namespace {

// Random ggml bytes of `type` (values do not matter for speed, only layout).
std::vector<uint8_t> RandomWeights(GgmlType type, int64_t rows, int64_t cols,
                                   uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(RowBytes(type, cols) * rows);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  // Keep fp16 scales / float values finite and small.
  const size_t block = TypeTraits(type).type_size;
  if (type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 ||
      type == GgmlType::kQ8_0) {
    for (size_t off = 0; off < bytes.size(); off += block) {
      const uint16_t d = Fp32ToFp16(0.01f);
      std::memcpy(&bytes[off], &d, 2);
      if (type == GgmlType::kQ4_1) std::memcpy(&bytes[off + 2], &d, 2);
    }
  } else if (IsDecodable(type)) {
    // The other quantized types: their fp16 scales (d, and dmin or m where
    // the type has one) at these byte offsets of a block.
    std::vector<size_t> halves = {0};
    if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K ||
        type == GgmlType::kQ5_1) {
      halves = {0, 2};
    } else if (type == GgmlType::kQ6_K) {
      halves = {208};
    } else if (type == GgmlType::kQ3_K) {
      halves = {108};
    } else if (type == GgmlType::kQ2_K) {
      halves = {80, 82};
    }
    const uint16_t d = Fp32ToFp16(0.001f);
    for (size_t off = 0; off < bytes.size(); off += block) {
      for (size_t h : halves) std::memcpy(&bytes[off + h], &d, 2);
    }
  } else {
    std::normal_distribution<float> dist(0.0f, 0.05f);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float f = dist(rng);
      if (type == GgmlType::kF32) {
        std::memcpy(&bytes[4 * i], &f, 4);
      } else {
        const uint16_t h =
            type == GgmlType::kF16 ? Fp32ToFp16(f) : Fp32ToBf16(f);
        std::memcpy(&bytes[2 * i], &h, 2);
      }
    }
  }
  return bytes;
}

PackedMatrix MakePacked(GgmlType type, int64_t rows, int64_t cols,
                        uint32_t seed, PackOptions options) {
  const std::vector<uint8_t> bytes = RandomWeights(type, rows, cols, seed);
  absl::StatusOr<PackedMatrix> p = PackMatrix(
      RawTensor{"bench", type, {cols, rows}, bytes.data(), bytes.size()},
      options);
  if (!p.ok()) {
    std::fprintf(stderr, "pack failed: %s\n", p.status().ToString().c_str());
    std::abort();
  }
  return std::move(*p);
}

std::vector<float> RandomActs(int64_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& f : x) f = dist(rng);
  return x;
}

template <typename D>
double Seconds(D d) {
  return std::chrono::duration<double>(d).count();
}

// Matrices with every representation, shared by all benchmarks of a shape.
PackedMatrix& GetPacked(GgmlType type, int64_t rows, int64_t cols) {
  static auto* cache =
      new std::map<std::tuple<GgmlType, int64_t, int64_t>, PackedMatrix>();
  auto it = cache->find({type, rows, cols});
  if (it != cache->end()) return it->second;
  PackedMatrix p = MakePacked(type, rows, cols, 42, {.all_paths = true});
  return cache->emplace(std::make_tuple(type, rows, cols), std::move(p))
      .first->second;
}

constexpr MatMulPath kPaths[] = {MatMulPath::kInt8Vnni, MatMulPath::kOwnFloat};

// Bytes of weights `path` streams per call.
double WeightBytes(MatMulPath path, const PackedMatrix& w) {
  const double n = static_cast<double>(w.rows() * w.cols());
  if (path == MatMulPath::kInt8Vnni) {
    return n * TypeTraits(w.source_type()).type_size / 32.0;
  }
  return w.source_type() == GgmlType::kF16 || w.source_type() == GgmlType::kBF16
             ? 2 * n
             : 4 * n;
}

void BM_Matmul(benchmark::State& state, GgmlType type, int64_t rows,
               int64_t cols, int64_t m, MatMulPath path) {
  PackedMatrix& w = GetPacked(type, rows, cols);
  const std::vector<float> x = RandomActs(m * cols);
  std::vector<float> y(m * rows);
  if (!w.Supports(path)) {
    state.SkipWithError("path not available");
    return;
  }
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    MatMulWithPath(x.data(), m, w, y.data(), path);
    benchmark::DoNotOptimize(y.data());
    best = std::min(best, Seconds(std::chrono::steady_clock::now() - t0));
  }
  state.counters["best_us"] = best * 1e6;
  state.counters["GBps"] = WeightBytes(path, w) * 1e-9 / best;
  state.counters["GFLOPs"] = 2e-9 * m * rows * cols / best;
}

// One forward's matmuls for SmolLM2-135M (fused QKV and gate/up, as
// models/cpu/cpu_llama_model.cc packs them): 30 x {960x576, 576x576, 3072x576,
// 576x1536} Q4_1 + the 49152x576 Q8_0 head (head only at decode, m rows).
struct Model {
  std::vector<PackedMatrix> layers;
  PackedMatrix head;
};
Model& GetModel() {
  static Model* model = [] {
    auto* md = new Model();
    const int64_t shapes[4][2] = {
        {960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
    for (int l = 0; l < 30; ++l) {
      for (const auto& s : shapes) {
        md->layers.push_back(
            MakePacked(GgmlType::kQ4_1, s[0], s[1], 100 + l, PackOptions{}));
      }
    }
    md->head = MakePacked(GgmlType::kQ8_0, 49152, 576, 7, PackOptions{});
    return md;
  }();
  return *model;
}

void BM_Sweep(benchmark::State& state, MatMulPath path, int64_t m,
              bool with_head) {
  Model& model = GetModel();
  const std::vector<float> x = RandomActs(m * 1536);
  std::vector<float> y(m * 49152);
  double bytes = 0, flops = 0;
  for (const PackedMatrix& w : model.layers) {
    bytes +=
        static_cast<double>(RowBytes(w.source_type(), w.cols()) * w.rows());
    flops += 2.0 * m * w.rows() * w.cols();
  }
  if (with_head) {
    bytes += static_cast<double>(RowBytes(GgmlType::kQ8_0, 576) * 49152);
    flops += 2.0 * m * 49152 * 576;
  }
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const PackedMatrix& w : model.layers) {
      MatMulWithPath(x.data(), m, w, y.data(), path);
    }
    if (with_head) MatMulWithPath(x.data(), m, model.head, y.data(), path);
    benchmark::DoNotOptimize(y.data());
    best = std::min(best, Seconds(std::chrono::steady_clock::now() - t0));
  }
  state.counters["best_ms"] = best * 1e3;
  state.counters["GGUF_GBps"] = bytes * 1e-9 / best;
  state.counters["GFLOPs"] = flops * 1e-9 / best;
}

// A Llama shape's fused per-layer matrices (rows x cols: QKV, O, gate+up,
// down), as CpuLlamaModel packs them.
struct LlamaShape {
  const char* name;
  int layers;
  int64_t mats[4][2];
};
constexpr LlamaShape kLlamaShapes[] = {
    {"llama-1b", 16, {{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192}}},
    {"llama-3b", 28, {{5120, 3072}, {3072, 3072}, {16384, 3072}, {3072, 8192}}},
};

void BM_ShapeSweep(benchmark::State& state, const LlamaShape& shape,
                   GgmlType type) {
  std::vector<PackedMatrix> mats;
  double bytes = 0;
  for (int l = 0; l < shape.layers; ++l) {
    for (const auto& m : shape.mats) {
      mats.push_back(MakePacked(type, m[0], m[1], 200 + l, PackOptions{}));
      bytes += static_cast<double>(RowBytes(type, m[1]) * m[0]);
    }
  }
  const std::vector<float> x = RandomActs(8192);
  std::vector<float> y(16384);
  double best = 1e30;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (const PackedMatrix& w : mats) {
      MatMulWithPath(x.data(), 1, w, y.data(), MatMulPath::kInt8Vnni);
    }
    benchmark::DoNotOptimize(y.data());
    best = std::min(best, Seconds(std::chrono::steady_clock::now() - t0));
  }
  state.counters["best_ms"] = best * 1e3;
  state.counters["GiBps"] = bytes / (1024.0 * 1024 * 1024) / best;
}

void RegisterAll() {
  struct Shape {
    GgmlType type;
    int64_t rows, cols;
  };
  const Shape shapes[] = {
      {GgmlType::kQ4_1, 576, 576},   {GgmlType::kQ4_1, 192, 576},
      {GgmlType::kQ4_1, 1536, 576},  {GgmlType::kQ4_1, 576, 1536},
      {GgmlType::kQ4_1, 960, 576},   {GgmlType::kQ4_1, 3072, 576},
      {GgmlType::kQ8_0, 49152, 576}, {GgmlType::kQ4_1, 4096, 4096},
      {GgmlType::kQ4_0, 4096, 4096}, {GgmlType::kQ8_0, 4096, 4096},
      {GgmlType::kBF16, 4096, 4096}, {GgmlType::kF16, 4096, 4096},
      {GgmlType::kBF16, 1536, 576},  {GgmlType::kQ4_K, 4096, 4096},
      {GgmlType::kQ6_K, 4096, 4096}, {GgmlType::kQ5_0, 4096, 4096},
  };
  for (const Shape& s : shapes) {
    const bool quant = IsDecodable(s.type);
    const std::vector<int64_t> ms =
        quant ? std::vector<int64_t>{1, 8, 32, 64, 512}
              : std::vector<int64_t>{1, 2, 4, 8, 64, 512};
    for (int64_t m : ms) {
      for (MatMulPath path : kPaths) {
        const std::string name =
            absl::StrCat("Matmul/", std::string(TypeName(s.type)), "/", s.rows,
                         "x", s.cols, "/m:", m, "/", PathName(path));
        benchmark::RegisterBenchmark(name.c_str(), BM_Matmul, s.type, s.rows,
                                     s.cols, m, path)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  for (const LlamaShape& shape : kLlamaShapes) {
    for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ8_0}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("ShapeSweep/", shape.name, "/",
                       std::string(TypeName(type)), "/m:1")
              .c_str(),
          BM_ShapeSweep, shape, type)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(10);
    }
  }
  for (MatMulPath p : {MatMulPath::kAuto, MatMulPath::kInt8Vnni}) {
    for (int64_t m : {1, 2, 4, 8}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("DecodeSweep/", PathName(p), "/m:", m).c_str(), BM_Sweep,
          p, m, true)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    for (int64_t m : {16, 24, 32, 40, 48, 56, 64, 128, 512}) {
      benchmark::RegisterBenchmark(
          absl::StrCat("PrefillSweep/", PathName(p), "/m:", m).c_str(),
          BM_Sweep, p, m, false)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
}

}  // namespace
}  // namespace kvserve::models::cpu

int main(int argc, char** argv) {
  kvserve::models::cpu::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
