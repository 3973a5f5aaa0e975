// The GPU table and the roofline step-time model (models/sim/), against
// figures worked out by hand from the datasheet rates and Llama-3-8B's
// architecture.
#include "models/sim/roofline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/loader/presets.h"
#include "models/sim/gpu_specs.h"

namespace kvserve::models::sim {
namespace {

using ::testing::HasSubstr;

ModelConfig Llama3_8B() {
  const ModelPreset* p = FindPreset("llama3-8b");
  EXPECT_NE(p, nullptr);
  return p->config;
}

// Llama-3-8B bf16, all layers: 32 x 8 KV heads x 128 x 2 (K, V) x 2 bytes.
constexpr int64_t kKvBytesPerToken = 131072;

TEST(GpuSpecsTest, KnownNamesAnyCaseAndAClearError) {
  absl::StatusOr<GpuSpec> h200 = FindGpu("H200");
  ASSERT_TRUE(h200.ok());
  EXPECT_EQ(h200->memory_bytes, 141'000'000'000);
  EXPECT_DOUBLE_EQ(h200->memory_bw, 4.8e12);
  for (const char* name : {"h100", "a100", "l40s"}) {
    EXPECT_TRUE(FindGpu(name).ok()) << name;
  }
  EXPECT_EQ(FindGpu("a100")->fp8_flops, 0);  // Ampere: no fp8 units
  const absl::Status bad = FindGpu("b200").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.message(), HasSubstr("'b200'"));
  EXPECT_THAT(bad.message(), HasSubstr("h100, h200, a100, l40s"));
}

TEST(RooflineTest, MatmulParamsLeaveOutTheEmbeddingTable) {
  const Roofline r(Llama3_8B(), *FindGpu("h200"), 1, 2.0, kKvBytesPerToken);
  // 32 x (2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336) + 128256 x 4096.
  EXPECT_EQ(r.MatmulParams(), 7'504'658'432);
}

TEST(RooflineTest, BatchOneDecodeReadsTheWeights) {
  const Roofline r(Llama3_8B(), *FindGpu("h200"), 1, 2.0, kKvBytesPerToken);
  const StepCost c = r.Decode(1, 1024);
  // 15.01 GB at 0.75 x 4.8 TB/s = 4.169 ms; 1,025 tokens of K/V 0.037 ms;
  // 4 us of host time for the one sequence.
  EXPECT_NEAR(c.weights_s, 4.169255e-3, 1e-8);
  EXPECT_NEAR(c.kv_s, 1025.0 * kKvBytesPerToken / 3.6e12, 1e-9);
  EXPECT_FALSE(c.compute_bound);
  EXPECT_DOUBLE_EQ(c.host_s, 4e-6);
  EXPECT_DOUBLE_EQ(c.total_s, c.weights_s + c.kv_s + c.host_s);
  EXPECT_EQ(c.allreduce_s, 0);
  // More sequences and longer contexts only add K/V and compute.
  EXPECT_GT(r.Decode(64, 1024).total_s, c.total_s);
  EXPECT_GT(r.Decode(64, 8192).total_s, r.Decode(64, 1024).total_s);
  EXPECT_DOUBLE_EQ(r.Decode(64, 1024).weights_s, c.weights_s);
}

TEST(RooflineTest, LongPrefillIsComputeBound) {
  const Roofline r(Llama3_8B(), *FindGpu("h100"), 1, 2.0, kKvBytesPerToken);
  const StepCost c = r.Prefill(8192);
  EXPECT_TRUE(c.compute_bound);
  // 2 x 7.505e9 x 8192 + 4 x 32 x 32 x 128 x 8192 x 8193 / 2 FLOPs at
  // 0.5 x 989.4 TFLOP/s.
  const double flops =
      2.0 * 7'504'658'432 * 8192 + 4.0 * 32 * 32 * 128 * (8192.0 * 8193 / 2);
  EXPECT_NEAR(c.compute_s, flops / (0.5 * 989.4e12), 1e-9);
  EXPECT_DOUBLE_EQ(c.total_s, c.compute_s + 4e-6);
}

TEST(RooflineTest, TensorParallelSplitsWorkAndAddsAllReduces) {
  const GpuSpec h100 = *FindGpu("h100");
  const Roofline one(Llama3_8B(), h100, 1, 2.0, kKvBytesPerToken);
  const Roofline two(Llama3_8B(), h100, 2, 2.0, kKvBytesPerToken / 2);
  const StepCost a = one.Decode(8, 2048);
  const StepCost b = two.Decode(8, 2048);
  EXPECT_NEAR(b.weights_s, a.weights_s / 2, 1e-12);
  EXPECT_NEAR(b.kv_s, a.kv_s / 2, 1e-12);
  // 2 per layer: 8 tokens x 4096 x 2 bytes, ring factor 1, at 0.7 x 450 GB/s,
  // plus 10 us each.
  const double each = 8.0 * 4096 * 2 / (0.7 * 450e9) + 10e-6;
  EXPECT_NEAR(b.allreduce_s, 64 * each, 1e-12);
  EXPECT_DOUBLE_EQ(b.total_s, b.weights_s + b.kv_s + b.allreduce_s + 8 * 4e-6);
}

// The host's time grows with the sequences of a step, not its tokens, and
// adds to the device's (not overlapped).
TEST(RooflineTest, HostTimePerSequenceAddsToTheStep) {
  const ModelConfig c = Llama3_8B();
  const Roofline none(c, *FindGpu("h100"), 1, 1.0, kKvBytesPerToken,
                      {.host_s_per_seq = 0});
  const Roofline some(c, *FindGpu("h100"), 1, 1.0, kKvBytesPerToken,
                      {.host_s_per_seq = 5e-6});
  const StepCost a = none.Decode(2048, 256);
  const StepCost b = some.Decode(2048, 256);
  EXPECT_EQ(a.host_s, 0);
  EXPECT_NEAR(b.host_s, 2048 * 5e-6, 1e-12);
  EXPECT_NEAR(b.total_s, a.total_s + 2048 * 5e-6, 1e-12);
  EXPECT_NEAR(some.Prefill(2048).total_s, none.Prefill(2048).total_s + 5e-6,
              1e-12);
}

TEST(RooflineTest, Fp8WeightsUseFp8UnitsWhereThereAreAny) {
  const ModelConfig c = Llama3_8B();
  const Roofline bf16(c, *FindGpu("h200"), 1, 2.0, kKvBytesPerToken);
  const Roofline fp8(c, *FindGpu("h200"), 1, 1.0, kKvBytesPerToken);
  EXPECT_DOUBLE_EQ(fp8.PeakFlops(), 1978.9e12);
  EXPECT_NEAR(fp8.Decode(1, 1).weights_s, bf16.Decode(1, 1).weights_s / 2,
              1e-12);
  // The matrix products at twice the rate, attention at the bf16 one.
  const double attn = 4.0 * 32 * 32 * 128 * (4096.0 * 4097 / 2);
  const double mm = 2.0 * 7'504'658'432 * 4096;
  EXPECT_NEAR(fp8.Prefill(4096).compute_s,
              (mm / 1978.9e12 + attn / 989.4e12) / 0.5, 1e-9);
  EXPECT_NEAR(bf16.Prefill(4096).compute_s, (mm + attn) / 989.4e12 / 0.5, 1e-9);
  const Roofline a100(c, *FindGpu("a100"), 1, 1.0, kKvBytesPerToken);
  EXPECT_DOUBLE_EQ(a100.PeakFlops(), 312e12);
}

// Attention on the fp8 units needs fp8 weights (fp8 activations) and a GPU
// with an fp8 rate; anything else leaves it at the bf16 rate.
TEST(RooflineTest, Fp8AttentionOnlyWithFp8WeightsOnFp8Hardware) {
  const ModelConfig c = Llama3_8B();
  const double attn = 4.0 * 32 * 32 * 128 * (4096.0 * 4097 / 2);
  const double mm = 2.0 * 7'504'658'432 * 4096;
  const Roofline fp8(c, *FindGpu("h200"), 1, 1.0, kKvBytesPerToken / 2, {},
                     AttentionUnits::kFp8);
  EXPECT_NEAR(fp8.Prefill(4096).compute_s, (mm + attn) / 1978.9e12 / 0.5, 1e-9);
  const Roofline bf16_weights(c, *FindGpu("h200"), 1, 2.0, kKvBytesPerToken / 2,
                              {}, AttentionUnits::kFp8);
  EXPECT_NEAR(bf16_weights.Prefill(4096).compute_s,
              (mm + attn) / 989.4e12 / 0.5, 1e-9);
  const Roofline a100(c, *FindGpu("a100"), 1, 1.0, kKvBytesPerToken / 2, {},
                      AttentionUnits::kFp8);
  EXPECT_NEAR(a100.Prefill(4096).compute_s, (mm + attn) / 312e12 / 0.5, 1e-9);
}

}  // namespace
}  // namespace kvserve::models::sim
