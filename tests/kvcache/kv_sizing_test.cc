#include "kvcache/kv_sizing.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::kvcache {
namespace {

using ::testing::HasSubstr;

constexpr KvShape kLlama3_70B{
    .num_layers = 80, .num_kv_heads = 8, .head_dim = 128};
constexpr KvShape kL64{.num_layers = 64, .num_kv_heads = 8, .head_dim = 128};
constexpr KvShape kSmolLM2_135M{
    .num_layers = 30, .num_kv_heads = 3, .head_dim = 64};
// DeepSeek-V3: MLA latent 512 + RoPE key 64 per layer; the 128 KV heads of
// its config.json do not enter the cache size.
constexpr KvShape kDeepSeekV3{.num_layers = 61,
                              .num_kv_heads = 128,
                              .head_dim = 192,
                              .kv_lora_rank = 512,
                              .qk_rope_head_dim = 64};

TEST(KvDtypeTest, ParsesNamesAndAliases) {
  EXPECT_EQ(*ParseKvDtype("bf16"), KvDtype::kBF16);
  EXPECT_EQ(*ParseKvDtype("BFloat16"), KvDtype::kBF16);
  EXPECT_EQ(*ParseKvDtype("fp16"), KvDtype::kF16);
  EXPECT_EQ(*ParseKvDtype("half"), KvDtype::kF16);
  EXPECT_EQ(*ParseKvDtype("FP8"), KvDtype::kFP8);
  EXPECT_EQ(*ParseKvDtype("e4m3"), KvDtype::kFP8);
  EXPECT_EQ(*ParseKvDtype("int8"), KvDtype::kInt8);
  EXPECT_EQ(*ParseKvDtype("q8_0"), KvDtype::kInt8);
  EXPECT_EQ(*ParseKvDtype("int4"), KvDtype::kInt4);
  EXPECT_EQ(*ParseKvDtype("Q4_0"), KvDtype::kInt4);
  EXPECT_EQ(*ParseKvDtype("int3"), KvDtype::kInt3);
  EXPECT_EQ(*ParseKvDtype("I2"), KvDtype::kInt2);
  EXPECT_EQ(*ParseKvDtype("f32"), KvDtype::kF32);
  absl::StatusOr<KvDtype> bad = ParseKvDtype("int5");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'int5'"));
  EXPECT_THAT(bad.status().message(),
              HasSubstr("bf16, fp16, fp8, int8, int4, int3, int2, f32"));
}

TEST(KvDtypeTest, BytesAndNamesRoundTrip) {
  for (KvDtype d :
       {KvDtype::kF32, KvDtype::kBF16, KvDtype::kF16, KvDtype::kFP8,
        KvDtype::kInt8, KvDtype::kInt4, KvDtype::kInt3, KvDtype::kInt2}) {
    EXPECT_EQ(*ParseKvDtype(KvDtypeName(d)), d);
  }
  EXPECT_EQ(KvBytesPerElement(KvDtype::kF32), 4);
  EXPECT_EQ(KvBytesPerElement(KvDtype::kBF16), 2);
  EXPECT_EQ(KvBytesPerElement(KvDtype::kF16), 2);
  EXPECT_EQ(KvBytesPerElement(KvDtype::kFP8), 1);
  EXPECT_EQ(KvBytesPerElement(KvDtype::kInt8), 34.0 / 32);  // q8_0
  EXPECT_EQ(KvBytesPerElement(KvDtype::kInt4), 18.0 / 32);  // q4_0
  EXPECT_EQ(KvRowBytes(KvDtype::kInt8, 128), 136);
  EXPECT_EQ(KvRowBytes(KvDtype::kInt4, 64), 36);
  EXPECT_EQ(KvRowBytes(KvDtype::kF16, 64), 128);
}

// KIVI's goals: int2 at least 4x and int3 at least 3.2x fewer bytes than
// fp16, scales and mins counted (a (scale, min) fp16 pair per 32 elements).
TEST(KvDtypeTest, LowBitDtypesCountTheirScales) {
  EXPECT_EQ(KvRowBytes(KvDtype::kInt2, 64), 16 + 8);
  EXPECT_EQ(KvRowBytes(KvDtype::kInt3, 64), 24 + 8);
  EXPECT_EQ(KvRowBytes(KvDtype::kInt3, 128), 48 + 16);
  EXPECT_EQ(KvBytesPerElement(KvDtype::kInt2), 0.375);
  EXPECT_EQ(KvBytesPerElement(KvDtype::kInt3), 0.5);
  for (const KvShape& s : {kLlama3_70B, kSmolLM2_135M}) {
    const int64_t fp16 = KvBytesPerToken(s, KvDtype::kF16);
    EXPECT_LE(KvBytesPerToken(s, KvDtype::kInt2) * 16, fp16 * 3);  // 5.3x
    EXPECT_LE(KvBytesPerToken(s, KvDtype::kInt3) * 4, fp16);
    // Fewer bytes than q4_0 (int4), which int3 beats on quality.
    EXPECT_LT(KvBytesPerToken(s, KvDtype::kInt3),
              KvBytesPerToken(s, KvDtype::kInt4));
  }
  EXPECT_EQ(KvRotationFor(KvDtype::kInt2, 64).k, 64);
  EXPECT_EQ(KvRotationFor(KvDtype::kInt3, 128).v, 64);
}

TEST(KvDtypeTest, LowBitDtypesNeedWholeKeyGroups) {
  EXPECT_TRUE(CheckKvDtypeShape(KvDtype::kInt2, 96).ok());
  absl::Status st = CheckKvDtypeShape(KvDtype::kInt3, 48);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("head_dim 48 is not a multiple of 32"));
  EXPECT_TRUE(CheckKvDtypeBlockSize(KvDtype::kInt2, 64).ok());
  EXPECT_TRUE(CheckKvDtypeBlockSize(KvDtype::kInt8, 7).ok());
  st = CheckKvDtypeBlockSize(KvDtype::kInt2, 16);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("--block-size 16"));
  EXPECT_THAT(st.message(), HasSubstr("multiple of 32"));
  // A block size nobody asked for is rounded up to whole key groups.
  EXPECT_EQ(KvDtypeDefaultBlockSize(KvDtype::kInt3, 16), 32);
  EXPECT_EQ(KvDtypeDefaultBlockSize(KvDtype::kInt2, 64), 64);
  EXPECT_EQ(KvDtypeDefaultBlockSize(KvDtype::kInt8, 16), 16);
}

TEST(KvDtypeTest, QuantizedDtypesNeedWholeGroups) {
  EXPECT_TRUE(CheckKvDtypeShape(KvDtype::kInt8, 64).ok());
  EXPECT_TRUE(CheckKvDtypeShape(KvDtype::kF16, 8).ok());
  const absl::Status st = CheckKvDtypeShape(KvDtype::kInt4, 48);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("head_dim 48 is not a multiple of 32"));
}

TEST(KvDtypeTest, IntegerDtypesRotateHeadsOfWholeSixtyFours) {
  for (KvDtype d : {KvDtype::kInt8, KvDtype::kInt4}) {
    EXPECT_EQ(KvRotationFor(d, 64).k, 64);
    EXPECT_EQ(KvRotationFor(d, 64).v, 64);
    EXPECT_EQ(KvRotationFor(d, 128).k, 128);
    EXPECT_EQ(KvRotationFor(d, 128).v, 64);
    EXPECT_EQ(KvRotationFor(d, 192).k, 64);   // largest power of two dividing
    EXPECT_EQ(KvRotationFor(d, 512).k, 256);  // at most 256
    EXPECT_EQ(KvRotationFor(d, 96).k, 0);     // not whole 64s: none
    EXPECT_EQ(KvRotationFor(d, 96).v, 0);
  }
  for (KvDtype d :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kFP8}) {
    EXPECT_EQ(KvRotationFor(d, 128).k, 0);
    EXPECT_EQ(KvRotationFor(d, 128).v, 0);
  }
}

TEST(KvSizingTest, Llama3_70BBf16) {
  EXPECT_EQ(KvBytesPerToken(kLlama3_70B, KvDtype::kBF16), 327'680);
  EXPECT_EQ(KvBytesPerToken(kLlama3_70B, KvDtype::kBF16) * 8192, 2'684'354'560);
  EXPECT_EQ(KvBytesPerBlock(kLlama3_70B, KvDtype::kBF16, 16), 5'242'880);
}

TEST(KvSizingTest, L64Fp16) {
  EXPECT_EQ(KvBytesPerToken(kL64, KvDtype::kF16), 262'144);
  EXPECT_EQ(KvBytesPerToken(kL64, KvDtype::kF16) * 4096, 1'073'741'824);
}

TEST(KvSizingTest, SmolLM2AndQuantizedKvHalvesBf16) {
  EXPECT_EQ(KvBytesPerToken(kSmolLM2_135M, KvDtype::kBF16), 23'040);
  // llama.cpp's bytes per token on the same model with -ctk/-ctv q8_0, q4_0.
  EXPECT_EQ(KvBytesPerToken(kSmolLM2_135M, KvDtype::kInt8), 12'240);
  EXPECT_EQ(KvBytesPerToken(kSmolLM2_135M, KvDtype::kInt4), 6'480);
  for (const KvShape& s : {kLlama3_70B, kL64, kSmolLM2_135M}) {
    const int64_t bf16 = KvBytesPerToken(s, KvDtype::kBF16);
    EXPECT_EQ(KvBytesPerToken(s, KvDtype::kFP8) * 2, bf16);
    // Group scales: 34 bytes per 32 elements (int8), 18 per 32 (int4).
    EXPECT_EQ(KvBytesPerToken(s, KvDtype::kInt8) * 64, bf16 * 34);
    EXPECT_EQ(KvBytesPerToken(s, KvDtype::kInt4) * 64, bf16 * 18);
    EXPECT_EQ(KvBytesPerToken(s, KvDtype::kF32), bf16 * 2);
  }
}

TEST(KvSizingTest, MhaIsEightTimesGqa) {
  const KvShape mha{.num_layers = 80, .num_kv_heads = 64, .head_dim = 128};
  EXPECT_EQ(KvBytesPerToken(mha, KvDtype::kBF16),
            8 * KvBytesPerToken(kLlama3_70B, KvDtype::kBF16));
}

TEST(KvSizingTest, TensorParallelSplitsThenReplicatesKvHeads) {
  EXPECT_EQ(KvHeadsPerRank(8, 1), 8);
  EXPECT_EQ(KvHeadsPerRank(8, 2), 4);
  EXPECT_EQ(KvHeadsPerRank(8, 8), 1);
  EXPECT_EQ(KvHeadsPerRank(8, 16), 1);  // replicated
  EXPECT_EQ(KvHeadsPerRank(3, 2), 2);   // uneven: largest shard
  EXPECT_EQ(KvBytesPerToken(kLlama3_70B, KvDtype::kBF16, 4), 327'680 / 4);
  EXPECT_EQ(KvBytesPerToken(kLlama3_70B, KvDtype::kBF16, 16), 327'680 / 8);
  EXPECT_EQ(KvBytesPerBlock(kLlama3_70B, KvDtype::kBF16, 16, 2),
            16 * 327'680 / 2);
}

TEST(KvSizingTest, MlaCachesOneLatentRowPerLayer) {
  EXPECT_TRUE(kDeepSeekV3.IsLatent());
  EXPECT_FALSE(kLlama3_70B.IsLatent());
  EXPECT_EQ(kDeepSeekV3.LatentDim(), 576);
  EXPECT_EQ(KvBytesPerToken(kDeepSeekV3, KvDtype::kBF16), 61 * 576 * 2);
  EXPECT_EQ(KvBytesPerToken(kDeepSeekV3, KvDtype::kBF16), 70'272);
  EXPECT_EQ(KvBytesPerToken(kDeepSeekV3, KvDtype::kFP8), 61 * 576);
  // q8_0 over the latent row: 576 / 32 = 18 groups of 34 bytes.
  EXPECT_EQ(KvBytesPerToken(kDeepSeekV3, KvDtype::kInt8), 61 * (576 / 32 * 34));
  EXPECT_EQ(KvBytesPerToken(kDeepSeekV3, KvDtype::kInt4), 61 * (576 / 32 * 18));
  // The latent is not split across heads: every rank stores all of it.
  for (int tp : {2, 8, 128}) {
    EXPECT_EQ(KvBytesPerToken(kDeepSeekV3, KvDtype::kBF16, tp), 70'272) << tp;
  }
}

TEST(KvPlanTest, MlaPlansLikeGqa) {
  const KvPlan p = ComputeKvPlan({.shape = kDeepSeekV3,
                                  .dtype = KvDtype::kBF16,
                                  .tp = 2,
                                  .block_size = 16,
                                  .context_len = 8192,
                                  .budget_bytes = 70'272 * 16 * 1000});
  EXPECT_EQ(p.kv_heads_per_rank, 1);
  EXPECT_EQ(p.bytes_per_token, 70'272);
  EXPECT_EQ(p.bytes_per_block, 70'272 * 16);
  EXPECT_EQ(p.bytes_per_seq, int64_t{70'272} * 8192);
  EXPECT_EQ(p.blocks_per_seq, 512);
  EXPECT_EQ(p.budget_blocks, 1000);
  EXPECT_EQ(p.paged_seqs_at_context, 1);
}

TEST(KvPlanTest, MlaLatentMustTileQuantGroups) {
  KvShape odd = kDeepSeekV3;
  odd.qk_rope_head_dim = 48;  // 560 elements: not whole groups of 32
  const absl::Status st = ValidateKvPlanInput(
      {.shape = odd, .dtype = KvDtype::kInt8, .context_len = 16});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("560 is not a multiple of 32"));
  EXPECT_TRUE(ValidateKvPlanInput(
                  {.shape = odd, .dtype = KvDtype::kBF16, .context_len = 16})
                  .ok());
  // MLA shapes need no KV heads.
  KvShape latent_only = kDeepSeekV3;
  latent_only.num_kv_heads = 0;
  latent_only.head_dim = 0;
  EXPECT_TRUE(
      ValidateKvPlanInput({.shape = latent_only, .context_len = 16}).ok());
}

TEST(KvSizingTest, BlocksForTokensRoundsUp) {
  EXPECT_EQ(BlocksForTokens(0, 16), 0);
  EXPECT_EQ(BlocksForTokens(1, 16), 1);
  EXPECT_EQ(BlocksForTokens(16, 16), 1);
  EXPECT_EQ(BlocksForTokens(17, 16), 2);
  EXPECT_EQ(BlocksForTokens(8192, 16), 512);
}

TEST(KvPlanTest, PerSequenceNumbersWithoutBudget) {
  const KvPlan p = ComputeKvPlan({.shape = kLlama3_70B,
                                  .dtype = KvDtype::kBF16,
                                  .block_size = 16,
                                  .context_len = 8192});
  EXPECT_EQ(p.kv_heads_per_rank, 8);
  EXPECT_EQ(p.bytes_per_token, 327'680);
  EXPECT_EQ(p.bytes_per_block, 5'242'880);
  EXPECT_EQ(p.bytes_per_seq, 2'684'354'560);
  EXPECT_EQ(p.blocks_per_seq, 512);
  EXPECT_EQ(p.paged_bytes_per_seq, 2'684'354'560);
  EXPECT_EQ(p.bytes_for_concurrency, 0);
  EXPECT_EQ(p.budget_blocks, 0);
  EXPECT_EQ(p.paged_seqs_at_context, 0);
  EXPECT_EQ(p.naive_seqs, 0);
  EXPECT_EQ(p.naive_idle_fraction, 0.0);
}

TEST(KvPlanTest, FiftySequencesOf4KAt64Layers) {
  const KvPlan p = ComputeKvPlan({.shape = kL64,
                                  .dtype = KvDtype::kF16,
                                  .context_len = 4096,
                                  .concurrency = 50,
                                  .budget_bytes = 53'687'091'200});
  EXPECT_EQ(p.bytes_per_seq, 1'073'741'824);
  EXPECT_EQ(p.bytes_for_concurrency, 53'687'091'200);
  EXPECT_TRUE(p.concurrency_fits);
  EXPECT_EQ(p.paged_seqs_at_context, 50);
  const KvPlan short_by_one = ComputeKvPlan({.shape = kL64,
                                             .dtype = KvDtype::kF16,
                                             .context_len = 4096,
                                             .concurrency = 50,
                                             .budget_bytes = 53'687'091'199});
  EXPECT_FALSE(short_by_one.concurrency_fits);
  EXPECT_EQ(short_by_one.paged_seqs_at_context, 49);
}

TEST(KvPlanTest, PartialLastBlockIsPaged) {
  const KvPlan p = ComputeKvPlan(
      {.shape = kSmolLM2_135M, .block_size = 16, .context_len = 17});
  EXPECT_EQ(p.bytes_per_seq, 17 * 23'040);
  EXPECT_EQ(p.blocks_per_seq, 2);
  EXPECT_EQ(p.paged_bytes_per_seq, 32 * 23'040);
}

TEST(KvPlanTest, BudgetPagedVsNaiveAndIdleKv) {
  // ~86 GB holds 32 Llama-3-70B sequences of 8,192 tokens.
  const KvPlan p = ComputeKvPlan({.shape = kLlama3_70B,
                                  .context_len = 8192,
                                  .mean_len = 800,
                                  .concurrency = 32,
                                  .budget_bytes = 86'000'000'000});
  EXPECT_EQ(p.bytes_for_concurrency, 85'899'345'920);
  EXPECT_TRUE(p.concurrency_fits);
  EXPECT_EQ(p.budget_blocks, int64_t{86'000'000'000} / 5'242'880);
  EXPECT_EQ(p.paged_seqs_at_context, 32);
  EXPECT_EQ(p.naive_seqs, 32);
  // 800 tokens = 50 blocks = 262,144,000 bytes.
  EXPECT_EQ(p.paged_seqs_at_mean, int64_t{86'000'000'000} / 262'144'000);
  EXPECT_EQ(p.paged_seqs_at_mean, 328);
  EXPECT_NEAR(p.naive_idle_fraction, 1.0 - 800.0 / 8192.0, 1e-12);
  EXPECT_NEAR(p.naive_idle_fraction, 0.902, 0.001);
  EXPECT_EQ(p.naive_idle_bytes_per_seq, int64_t{8192 - 800} * 327'680);
  EXPECT_NEAR(p.paged_idle_fraction, 8.0 / 808.0, 1e-12);
  EXPECT_LT(p.paged_idle_fraction, 0.04);  // PagedAttention: under 4%
  EXPECT_EQ(p.paged_idle_bytes_per_seq, 8 * 327'680);
}

TEST(KvPlanTest, NaiveMaxLenSeparateFromContext) {
  const KvPlan p = ComputeKvPlan({.shape = kLlama3_70B,
                                  .context_len = 4096,
                                  .naive_max_len = 8192,
                                  .budget_bytes = 86'000'000'000});
  EXPECT_EQ(p.paged_seqs_at_context, 64);
  EXPECT_EQ(p.naive_seqs, 32);
}

TEST(KvPlanTest, ValidationNamesTheField) {
  KvPlanInput in{.shape = kLlama3_70B, .context_len = 8192};
  EXPECT_TRUE(ValidateKvPlanInput(in).ok());
  KvPlanInput bad = in;
  bad.tp = 0;
  EXPECT_THAT(ValidateKvPlanInput(bad).message(), HasSubstr("tp"));
  bad = in;
  bad.block_size = 0;
  EXPECT_THAT(ValidateKvPlanInput(bad).message(), HasSubstr("block_size"));
  bad = in;
  bad.context_len = 0;
  EXPECT_THAT(ValidateKvPlanInput(bad).message(), HasSubstr("context_len"));
  bad = in;
  bad.shape.num_kv_heads = 0;
  EXPECT_THAT(ValidateKvPlanInput(bad).message(), HasSubstr("num_kv_heads"));
  bad = in;
  bad.mean_len = 9000;
  EXPECT_THAT(ValidateKvPlanInput(bad).message(), HasSubstr("mean_len"));
  bad = in;
  bad.context_len = int64_t{1} << 40;
  bad.concurrency = int64_t{1} << 30;
  EXPECT_EQ(ValidateKvPlanInput(bad).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvPlanDeathTest, ComputeRejectsInvalidInput) {
  EXPECT_DEATH((void)ComputeKvPlan({.shape = kLlama3_70B, .context_len = 0}),
               "context_len");
}

}  // namespace
}  // namespace kvserve::kvcache
