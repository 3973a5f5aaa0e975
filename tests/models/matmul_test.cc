// Tests of the CPU GEMM path (models/cpu/matmul.h): every weight type x batch
// size x odd row count x kernel path against a double-precision reference
// on weights dequantized by an independent test-side codec.
#include "models/cpu/matmul.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "gtest/gtest.h"
#include "models/cpu/float_kernels.h"
#include "models/cpu/matmul_internal.h"
#include "models/cpu/quant_kernels.h"
#include "models/ggml_types.h"

namespace kvserve::models::cpu {
namespace {

// A weight matrix in ggml bytes plus the exact values those bytes decode to.
struct TestWeights {
  GgmlType type;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // rows x cols, what the bytes decode to

  RawTensor Tensor() const {
    return RawTensor{
        "test.weight", type, {cols, rows}, bytes.data(), bytes.size()};
  }
};

template <typename Block>
void AppendBlock(const Block& b, std::vector<uint8_t>* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(&b);
  out->insert(out->end(), p, p + sizeof(b));
}

// ggml's reference quantizers (quantize_row_*_ref), decoding as they go.
void QuantizeBlock(GgmlType type, const float* x, TestWeights* w, float* v) {
  if (type == GgmlType::kQ4_0) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
    }
    const float d = max / -8;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ4_0 b;
    b.d = Fp32ToFp16(d);
    const float dd = Fp16ToFp32(b.d);
    int q[32];
    for (int j = 0; j < 32; ++j) {
      q[j] = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      v[j] = dd * (q[j] - 8);
    }
    for (int j = 0; j < 16; ++j) b.qs[j] = q[j] | (q[j + 16] << 4);
    AppendBlock(b, &w->bytes);
  } else if (type == GgmlType::kQ4_1) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; ++j)
      lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
    const float d = (hi - lo) / 15;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ4_1 b;
    b.d = Fp32ToFp16(d);
    b.m = Fp32ToFp16(lo);
    int q[32];
    for (int j = 0; j < 32; ++j) {
      q[j] = std::min(15, static_cast<int>((x[j] - lo) * id + 0.5f));
      v[j] = Fp16ToFp32(b.d) * q[j] + Fp16ToFp32(b.m);
    }
    for (int j = 0; j < 16; ++j) b.qs[j] = q[j] | (q[j + 16] << 4);
    AppendBlock(b, &w->bytes);
  } else {  // Q8_0
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = Fp32ToFp16(d);
    for (int j = 0; j < 32; ++j) {
      b.qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
      v[j] = Fp16ToFp32(b.d) * b.qs[j];
    }
    AppendBlock(b, &w->bytes);
  }
}

TestWeights MakeWeights(GgmlType type, int64_t rows, int64_t cols,
                        uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  TestWeights w{type, rows, cols, {}, std::vector<float>(rows * cols)};
  std::vector<float> x(rows * cols);
  for (float& f : x) f = dist(rng);
  for (int64_t i = 0; i < rows * cols; ++i) {
    uint16_t h = 0;
    switch (type) {
      case GgmlType::kF32:
        w.values[i] = x[i];
        w.bytes.resize(w.bytes.size() + 4);
        std::memcpy(w.bytes.data() + 4 * i, &x[i], 4);
        continue;
      case GgmlType::kF16:
        h = Fp32ToFp16(x[i]);
        w.values[i] = Fp16ToFp32(h);
        break;
      case GgmlType::kBF16:
        h = Fp32ToBf16(x[i]);
        w.values[i] = Bf16ToFp32(h);
        break;
      default:
        if (i % 32 == 0) QuantizeBlock(type, &x[i], &w, &w.values[i]);
        continue;
    }
    w.bytes.push_back(h & 0xff);
    w.bytes.push_back(h >> 8);
  }
  return w;
}

std::vector<float> RandomActivations(int64_t m, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(m * cols);
  for (float& f : x) f = dist(rng);
  return x;
}

std::vector<double> MatMulReference(const std::vector<float>& x, int64_t m,
                                    const TestWeights& w) {
  std::vector<double> y(m * w.rows);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < w.rows; ++r) {
      double acc = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        acc +=
            static_cast<double>(x[i * w.cols + k]) * w.values[r * w.cols + k];
      }
      y[i * w.rows + r] = acc;
    }
  }
  return y;
}

// ||y - ref|| / ||ref||.
double RelativeError(const std::vector<float>& y,
                     const std::vector<double>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (y[i] - ref[i]) * (y[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return std::sqrt(err / norm);
}

// ||y - ref|| / sqrt(sum_{i,r} |x_i|^2 |w_r|^2 / cols): for random data
// E[(x.w)^2] = |x|^2 |w|^2 / cols, so this equals RelativeError in
// expectation but stays stable with few outputs (a 3-element ||ref|| is
// often small by chance).
double ScaledError(const std::vector<float>& y, const std::vector<double>& ref,
                   const std::vector<float>& x, int64_t m,
                   const TestWeights& w) {
  double err = 0, xs = 0, ws = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (y[i] - ref[i]) * (y[i] - ref[i]);
  }
  for (int64_t i = 0; i < m * w.cols; ++i) xs += double{x[i]} * x[i];
  for (float v : w.values) ws += double{v} * v;
  return std::sqrt(err * w.cols / (xs * ws));
}

bool IsQuant(GgmlType t) {
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0;
}

// Error bound of a path on weights of `type`.
double Tolerance(MatMulPath path, GgmlType type) {
  switch (path) {
    case MatMulPath::kInt8Vnni:
      return 1e-2;  // int8 activations
    default:
      return 1e-5;  // fp32 activations x exact weights
  }
}

// What kAuto runs (the same for every batch size).
MatMulPath AutoPath(GgmlType type) {
  return IsQuant(type) ? MatMulPath::kInt8Vnni : MatMulPath::kOwnFloat;
}

using Case = std::tuple<GgmlType, int64_t /*m*/, int64_t /*rows*/>;

class MatMulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatMulTest, EveryPathMatchesReference) {
  const auto [type, m, rows] = GetParam();
  const int64_t cols = 160;  // 5 quant blocks
  const TestWeights w = MakeWeights(type, rows, cols, 7 + rows);
  const std::vector<float> x = RandomActivations(m, cols, 11 + m);
  const std::vector<double> ref = MatMulReference(x, m, w);

  absl::StatusOr<PackedMatrix> packed =
      PackMatrix(w.Tensor(), {.all_paths = true});
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->rows(), rows);
  EXPECT_EQ(packed->cols(), cols);
  EXPECT_EQ(packed->source_type(), type);
  EXPECT_GT(packed->bytes(), 0u);

  for (MatMulPath path :
       {MatMulPath::kAuto, MatMulPath::kInt8Vnni, MatMulPath::kOwnFloat}) {
    if (!packed->Supports(path)) {
      EXPECT_TRUE(path == MatMulPath::kInt8Vnni && !IsQuant(type))
          << PathName(path);
      continue;
    }
    std::vector<float> y(m * rows, std::nanf(""));
    MatMulWithPath(x.data(), m, *packed, y.data(), path);
    const MatMulPath effective =
        path == MatMulPath::kAuto ? AutoPath(type) : path;
    EXPECT_LE(ScaledError(y, ref, x, m, w), Tolerance(effective, type))
        << PathName(path);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, MatMulTest,
    ::testing::Combine(::testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1,
                                         GgmlType::kQ8_0, GgmlType::kF16,
                                         GgmlType::kBF16, GgmlType::kF32),
                       ::testing::Values(1, 2, 7, 16, 33, 128),
                       ::testing::Values(1, 3, 192, 577)),
    [](const ::testing::TestParamInfo<Case>& info) {
      return absl::StrCat(std::string(TypeName(std::get<0>(info.param))), "_m",
                          std::get<1>(info.param), "_rows",
                          std::get<2>(info.param));
    });

// Default packing (what the forward uses): SmolLM2-like shapes, kAuto only.
TEST(MatMulDefaultPackTest, ModelShapes) {
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{960, 576}, {576, 1536}, {3072, 576}}) {
      const TestWeights w = MakeWeights(type, rows, cols, 3);
      absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
      ASSERT_TRUE(packed.ok()) << packed.status();
      EXPECT_FALSE(packed->Supports(MatMulPath::kOwnFloat));
      for (int64_t m : {1, 5, 16, 100, 513}) {
        const std::vector<float> x = RandomActivations(m, cols, 5);
        std::vector<float> y(m * rows);
        MatMul(x.data(), m, *packed, y.data());
        EXPECT_LE(RelativeError(y, MatMulReference(x, m, w)),
                  Tolerance(AutoPath(type), type))
            << rows << "x" << cols << " m=" << m;
      }
    }
  }
}

// The prefetch level of small tiles changes speed only: the outputs are
// bit-identical, and the tiles of a 4096-wide matrix are not small.
TEST(MatMulDefaultPackTest, TilePrefetchLevelChangesNoResult) {
  const TilePrefetchLevel saved = SmallTilePrefetch();
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    const TestWeights w = MakeWeights(type, 960, 768, 4);
    absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
    ASSERT_TRUE(packed.ok()) << packed.status();
    EXPECT_TRUE(packed->HasSmallTiles()) << TypeName(type);
    for (int64_t m : {1, 5, 40}) {
      const std::vector<float> x = RandomActivations(m, 768, 7);
      std::vector<float> y1(m * 960), y2(m * 960);
      SetSmallTilePrefetch(TilePrefetchLevel::kL1);
      EXPECT_EQ(SmallTilePrefetch(), TilePrefetchLevel::kL1);
      MatMul(x.data(), m, *packed, y1.data());
      SetSmallTilePrefetch(TilePrefetchLevel::kL2);
      EXPECT_EQ(SmallTilePrefetch(), TilePrefetchLevel::kL2);
      MatMul(x.data(), m, *packed, y2.data());
      EXPECT_EQ(y1, y2) << TypeName(type) << " m=" << m;
    }
  }
  const TestWeights big = MakeWeights(GgmlType::kQ8_0, 32, 4096, 4);
  absl::StatusOr<PackedMatrix> packed = PackMatrix(big.Tensor());
  ASSERT_TRUE(packed.ok());
  EXPECT_FALSE(packed->HasSmallTiles());
  SetSmallTilePrefetch(saved);
}

TEST(MatMulTest, FloatKernelsHandleOddCols) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    const TestWeights w = MakeWeights(type, 21, 37, 1);
    absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
    ASSERT_TRUE(packed.ok()) << packed.status();
    for (int64_t m : {1, 6, 40}) {
      const std::vector<float> x = RandomActivations(m, 37, 2);
      std::vector<float> y(m * 21);
      MatMul(x.data(), m, *packed, y.data());
      EXPECT_LE(ScaledError(y, MatMulReference(x, m, w), x, m, w),
                Tolerance(AutoPath(type), type))
          << TypeName(type) << " m=" << m;
    }
  }
}

// A row's result is the same to the bit alone and in any batch (the
// speculative and concurrency checks rest on it), odd columns included.
TEST(MatMulTest, FloatRowsEqualAloneAndInABatch) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    const TestWeights w = MakeWeights(type, 21, 77, 3);
    absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
    ASSERT_TRUE(packed.ok()) << packed.status();
    constexpr int64_t kM = 7;
    const std::vector<float> x = RandomActivations(kM, 77, 4);
    std::vector<float> batch(kM * 21), one(21);
    MatMul(x.data(), kM, *packed, batch.data());
    for (int64_t i = 0; i < kM; ++i) {
      MatMul(x.data() + i * 77, 1, *packed, one.data());
      ASSERT_EQ(
          0, std::memcmp(one.data(), batch.data() + i * 21, 21 * sizeof(float)))
          << TypeName(type) << " row " << i;
    }
  }
}

TEST(MatMulTest, LongRowsInt8) {
  const TestWeights w = MakeWeights(GgmlType::kQ4_1, 40, 4096, 9);
  absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
  ASSERT_TRUE(packed.ok()) << packed.status();
  const std::vector<float> x = RandomActivations(20, 4096, 4);
  std::vector<float> y(20 * 40);
  MatMul(x.data(), 20, *packed, y.data());  // int8 at every m
  EXPECT_LE(RelativeError(y, MatMulReference(x, 20, w)), 1e-2);
}

// Zero blocks (scale 0), large magnitudes and a single-spike block.
TEST(MatMulTest, Int8ActivationEdgeCases) {
  const TestWeights w = MakeWeights(GgmlType::kQ8_0, 17, 128, 5);
  absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
  ASSERT_TRUE(packed.ok());
  std::vector<float> x = RandomActivations(3, 128, 6);
  for (int k = 0; k < 32; ++k) x[k] = 0.0f;
  for (int k = 32; k < 64; ++k) x[k] *= 1e4f;
  for (int k = 128; k < 160; ++k) x[k] = k == 140 ? 3.0f : 0.0f;
  std::vector<float> y(3 * 17);
  MatMul(x.data(), 3, *packed, y.data());
  EXPECT_LE(ScaledError(y, MatMulReference(x, 3, w), x, 3, w), 1e-2);
}

// The portable (non-SIMD) kernels compute the same as the SIMD ones.
TEST(MatMulTest, PortableKernelsMatch) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    const TestWeights w = MakeWeights(type, 35, 96, 8);
    absl::StatusOr<internal::QuantTiles> tiles =
        internal::PackQuantTiles(type, w.bytes.data(), 35, 96);
    ASSERT_TRUE(tiles.ok());
    const std::vector<float> x = RandomActivations(6, 96, 3);
    internal::QuantizedActs simd, portable;
    internal::QuantizeActivations(x.data(), 6, 96, &simd);
    internal::QuantizeActivations(x.data(), 6, 96, &portable, true);
    std::vector<float> y1(6 * 35), y2(6 * 35);
    internal::QuantMatMul(simd, *tiles, y1.data());
    internal::QuantMatMul(portable, *tiles, y2.data(),
                          internal::QuantIsa::kPortable);
    const std::vector<double> ref = MatMulReference(x, 6, w);
    EXPECT_LE(ScaledError(y1, ref, x, 6, w), 1e-2) << TypeName(type);
    EXPECT_LE(ScaledError(y2, ref, x, 6, w), 1e-2) << TypeName(type);
    for (size_t i = 0; i < y1.size(); ++i) {
      ASSERT_NEAR(y1[i], y2[i], 1e-4f * (1.0f + std::fabs(y1[i])))
          << TypeName(type) << " " << i;
    }
  }
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    const TestWeights w = MakeWeights(type, 13, 50, 8);
    absl::StatusOr<internal::FloatRows> rows =
        internal::PackFloatRows(type, w.bytes.data(), 13, 50);
    ASSERT_TRUE(rows.ok());
    const std::vector<float> x = RandomActivations(5, 50, 3);
    std::vector<float> y(5 * 13);
    internal::FloatMatMul(x.data(), 5, *rows, y.data(), true);
    EXPECT_LE(ScaledError(y, MatMulReference(x, 5, w), x, 5, w), 1e-5)
        << TypeName(type);
  }
}

// Results do not depend on how rows are split over threads.
TEST(MatMulTest, ThreadCountInvariant) {
  const TestWeights w = MakeWeights(GgmlType::kQ4_1, 577, 192, 2);
  absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
  ASSERT_TRUE(packed.ok());
  const std::vector<float> x = RandomActivations(3, 192, 1);
  std::vector<float> y1(3 * 577), y2(3 * 577);
  const int saved = NumThreads();
  SetNumThreads(1);
  MatMul(x.data(), 3, *packed, y1.data());
  SetNumThreads(std::max(2, saved));
  MatMul(x.data(), 3, *packed, y2.data());
  SetNumThreads(saved);
  EXPECT_EQ(y1, y2);
}

TEST(MatMulTest, MoveKeepsContents) {
  const TestWeights w = MakeWeights(GgmlType::kQ4_0, 19, 64, 4);
  absl::StatusOr<PackedMatrix> packed = PackMatrix(w.Tensor());
  ASSERT_TRUE(packed.ok());
  PackedMatrix moved = std::move(*packed);
  PackedMatrix assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.rows(), 19);
  const std::vector<float> x = RandomActivations(1, 64, 1);
  std::vector<float> y(19);
  MatMul(x.data(), 1, assigned, y.data());
  EXPECT_LE(ScaledError(y, MatMulReference(x, 1, w), x, 1, w), 1e-2);
}

TEST(MatMulTest, DequantizeMatchesCodec) {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0,
                        GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32}) {
    const TestWeights w = MakeWeights(type, 5, 64, 12);
    absl::StatusOr<std::vector<float>> f = DequantizeToF32(w.Tensor());
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(*f, w.values) << TypeName(type);
  }
}

TEST(MatMulTest, PackRejectsBadTensors) {
  TestWeights w = MakeWeights(GgmlType::kQ4_0, 4, 64, 1);
  RawTensor t = w.Tensor();
  t.type = GgmlType::kQ5_0;
  EXPECT_EQ(PackMatrix(t).status().code(), absl::StatusCode::kInvalidArgument);
  t = w.Tensor();
  t.shape = {48, 4};  // not a multiple of 32
  EXPECT_EQ(PackMatrix(t).status().code(), absl::StatusCode::kInvalidArgument);
  t = w.Tensor();
  t.nbytes -= 1;
  EXPECT_EQ(PackMatrix(t).status().code(), absl::StatusCode::kInvalidArgument);
  t = w.Tensor();
  t.shape = {64, 2, 2};
  EXPECT_EQ(PackMatrix(t).status().code(), absl::StatusCode::kInvalidArgument);
  t = w.Tensor();
  t.data = nullptr;
  EXPECT_EQ(PackMatrix(t).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvserve::models::cpu
