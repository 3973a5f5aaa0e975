// Dequantization: hand-built blocks with known values, round trips through
// reference quantizers, and golden values from the Python `gguf` package
// (tools/gen_dequant_golden.py) on the default model.
#include "models/dequant.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "models/loader/gguf.h"
#include "models/loader/mapped_file.h"
#include "nlohmann/json.hpp"
#include "tests/models/model_writer_testutil.h"

namespace kvserve::models {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

template <typename Block>
std::vector<float> Dequant(GgmlType type, const std::vector<Block>& blocks) {
  std::vector<float> out(blocks.size() * 32, -999.0f);
  absl::Status s = DequantizeRow(type, blocks.data(), out.data(), out.size());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(DequantTest, Q8_0HandBuilt) {
  BlockQ8_0 b{};
  b.d = Fp32ToFp16(0.5f);
  for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);
  const std::vector<float> y = Dequant(GgmlType::kQ8_0, std::vector{b});
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (j * 8 - 128)) << j;
}

TEST(DequantTest, Q4_0NibbleOrder) {
  BlockQ4_0 b{};
  b.d = Fp32ToFp16(0.25f);
  // Byte j: low nibble = element j (value j), high nibble = element j + 16
  // (value 15 - j).
  for (int j = 0; j < 16; ++j)
    b.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  const std::vector<float> y = Dequant(GgmlType::kQ4_0, std::vector{b});
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.25f * (15 - j - 8)) << j;
  }
}

TEST(DequantTest, Q4_1ScaleAndMin) {
  BlockQ4_1 b[2]{};
  b[0].d = Fp32ToFp16(0.5f);
  b[0].m = Fp32ToFp16(-3.0f);
  b[1].d = Fp32ToFp16(2.0f);
  b[1].m = Fp32ToFp16(1.0f);
  for (int j = 0; j < 16; ++j) {
    b[0].qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
    b[1].qs[j] = static_cast<uint8_t>(15 | 0 << 4);
  }
  const std::vector<float> y =
      Dequant(GgmlType::kQ4_1, std::vector{b[0], b[1]});
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 3.0f) << j;
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j) - 3.0f) << j;
    EXPECT_EQ(y[32 + j], 31.0f) << j;
    EXPECT_EQ(y[48 + j], 1.0f) << j;
  }
}

TEST(DequantTest, PlainTypes) {
  const std::vector<float> x = {0.0f, -1.0f, 0.5f, 65504.0f, 1e-7f, 3.140625f};
  float y[6];
  ASSERT_TRUE(DequantizeRow(GgmlType::kF32, x.data(), y, 6).ok());
  EXPECT_EQ(std::memcmp(x.data(), y, sizeof(y)), 0);
  const std::string f16 = testing::HalfBytes(x, /*bf16=*/false);
  ASSERT_TRUE(DequantizeRow(GgmlType::kF16, f16.data(), y, 6).ok());
  EXPECT_THAT(y, ElementsAre(0.0f, -1.0f, 0.5f, 65504.0f, Fp16ToFp32(0x0002),
                             3.140625f));
  const uint16_t bf16[3] = {0x3f80, 0xc000, 0x4049};  // 1, -2, 3.140625
  ASSERT_TRUE(DequantizeRow(GgmlType::kBF16, bf16, y, 3).ok());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 3.140625f);
}

// Quantize random data with the reference quantizers, dequantize, and check
// each value is within half a quantization step (plus fp16 rounding of the
// scale) of the original.
TEST(DequantTest, RoundTripThroughReferenceQuantizers) {
  const std::vector<float> x = testing::TestValues(32 * 64, 7, 2.0f);
  struct Case {
    GgmlType type;
    float step_fraction;  // of the block's max |x| (or range for Q4_1)
  };
  for (const Case& c :
       {Case{GgmlType::kQ8_0, 1.0f / 127}, Case{GgmlType::kQ4_0, 1.0f / 8},
        Case{GgmlType::kQ4_1, 1.0f / 15}}) {
    const std::string q = testing::Encode(c.type, x);
    ASSERT_EQ(q.size(), RowBytes(c.type, x.size()));
    std::vector<float> y(x.size());
    ASSERT_TRUE(DequantizeRow(c.type, q.data(), y.data(), x.size()).ok());
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float lo = x[b * 32], hi = x[b * 32], amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      const float range = c.type == GgmlType::kQ4_1 ? hi - lo : amax;
      const float step = range * c.step_fraction;
      for (int j = 0; j < 32; ++j) {
        const size_t i = b * 32 + j;
        // Q4_0 clamps the top code, so its worst case is a full step.
        const float tol =
            (c.type == GgmlType::kQ4_0 ? 1.0f : 0.5f) * step + range * 2e-3f;
        EXPECT_NEAR(y[i], x[i], tol) << TypeName(c.type) << " at " << i;
      }
    }
  }
}

TEST(DequantTest, ErrorsNameTheType) {
  float y[256];
  const uint8_t zeros[512] = {};  // holds one Q8_K block (292 bytes)
  absl::Status s = DequantizeRow(GgmlType::kQ8_K, zeros, y, 256);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("Q8_K"));
  s = DequantizeRow(static_cast<GgmlType>(99), zeros, y, 32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("99"));
  s = DequantizeRow(GgmlType::kQ8_0, zeros, y, 33);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("multiple of the block size 32"));

  RawTensor t;
  t.name = "blk.0.ffn_up.weight";
  t.type = GgmlType::kQ8_K;
  t.shape = {256, 1};
  t.data = zeros;
  t.nbytes = 292;
  auto r = DequantizeTensor(t);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("Q8_K"));
  EXPECT_THAT(r.status().message(), HasSubstr("blk.0.ffn_up.weight"));
  t.type = GgmlType::kQ8_0;
  t.shape = {32, 2};
  t.nbytes = 34;  // should be 68
  r = DequantizeTensor(t);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("blk.0.ffn_up.weight"));
}

TEST(DequantTest, TensorAndRow) {
  const std::vector<float> x = testing::TestValues(64 * 3, 11);
  const std::string q = testing::QuantizeQ8_0(x);
  RawTensor t;
  t.name = "w";
  t.type = GgmlType::kQ8_0;
  t.shape = {64, 3};
  t.data = q.data();
  t.nbytes = q.size();
  auto all = DequantizeTensor(t);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 192u);
  std::vector<float> row(64);
  ASSERT_TRUE(DequantizeTensorRow(t, 2, row.data()).ok());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(row[i], (*all)[128 + i]);
  EXPECT_EQ(DequantizeTensorRow(t, 3, row.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeTensorRow(t, -1, row.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Golden values from tools/gen_dequant_golden.py (gguf.quants.dequantize).
TEST(DequantTest, MatchesPythonGgufOnDefaultModel) {
  auto text =
      ReadFileToString(KVSERVE_SOURCE_DIR "/tests/data/dequant_golden.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const auto golden =
      nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(golden.is_discarded());
  auto f = GgufFile::Open(KVSERVE_SOURCE_DIR "/weights/" +
                          golden["model"].get<std::string>());
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_GE(golden["cases"].size(), 3u);
  for (const auto& c : golden["cases"]) {
    const std::string name = c["tensor"].get<std::string>();
    SCOPED_TRACE(name);
    auto t = (*f)->GetTensor(name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(TypeName(t->type), c["type"].get<std::string>());
    std::vector<float> values;
    const int64_t row = c["row"].get<int64_t>();
    if (row < 0) {
      auto all = DequantizeTensor(*t);
      ASSERT_TRUE(all.ok()) << all.status();
      values = std::move(*all);
    } else {
      values.resize(t->shape[0]);
      ASSERT_TRUE(DequantizeTensorRow(*t, row, values.data()).ok());
    }
    ASSERT_EQ(static_cast<int64_t>(values.size()), c["count"].get<int64_t>());
    const auto& first = c["first"];
    for (size_t i = 0; i < first.size(); ++i) {
      EXPECT_NEAR(values[i], first[i].get<double>(), 1e-6) << i;
    }
    double sum = 0, sum_sq = 0;
    for (float v : values) {
      sum += v;
      sum_sq += static_cast<double>(v) * v;
    }
    const double gsum = c["sum"].get<double>();
    const double gsq = c["sum_sq"].get<double>();
    EXPECT_NEAR(sum, gsum, 1e-6 * std::max(1.0, std::fabs(gsum)));
    EXPECT_NEAR(sum_sq, gsq, 1e-6 * std::max(1.0, gsq));
  }
}

}  // namespace
}  // namespace kvserve::models
