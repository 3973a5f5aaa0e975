// Rope's tables and the linear scaling chosen at start (--rope-scale).
#include "models/rope.h"

#include <vector>

#include "gtest/gtest.h"

namespace kvserve::models {
namespace {

ModelConfig SmallConfig() {
  ModelConfig c;
  c.head_dim = 64;
  c.max_position = 8192;
  c.rope_theta = 100000.0f;
  return c;
}

TEST(RopeScaleTest, LinearScaleStretchesPositionsAndContext) {
  ModelConfig c = SmallConfig();
  ASSERT_TRUE(ApplyLinearRopeScale(2.0f, &c).ok());
  EXPECT_EQ(c.max_position, 16384);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  // Position 2p with factor 2 rotates as position p without scaling.
  const Rope scaled(c), plain(SmallConfig());
  const int32_t doubled[] = {0, 2, 4000, 16382}, single[] = {0, 1, 2000, 8191};
  std::vector<float> cs(4 * 32), ss(4 * 32), cp(4 * 32), sp(4 * 32);
  scaled.Tables(doubled, 4, cs.data(), ss.data());
  plain.Tables(single, 4, cp.data(), sp.data());
  for (int i = 0; i < 4 * 32; ++i) {
    EXPECT_NEAR(cs[i], cp[i], 1e-5f) << i;
    EXPECT_NEAR(ss[i], sp[i], 1e-5f) << i;
  }
}

TEST(RopeScaleTest, FactorOneChangesNothing) {
  ModelConfig c = SmallConfig();
  ASSERT_TRUE(ApplyLinearRopeScale(1.0f, &c).ok());
  EXPECT_EQ(c.max_position, 8192);
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::kNone);
}

TEST(RopeScaleTest, RefusesOutOfRangeAndASecondScaling) {
  ModelConfig c = SmallConfig();
  for (float bad : {0.5f, 0.0f, -2.0f, 65.0f}) {
    const absl::Status s = ApplyLinearRopeScale(bad, &c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--rope-scale"), std::string::npos);
  }
  c.rope_scaling.type = RopeScalingType::kLlama3;
  c.rope_scaling.factor = 8.0f;
  const absl::Status s = ApplyLinearRopeScale(2.0f, &c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("already scales RoPE (llama3, factor 8)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(c.max_position, 8192);
}

}  // namespace
}  // namespace kvserve::models
