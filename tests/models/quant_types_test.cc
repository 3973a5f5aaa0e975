// Every quantized weight type against an independent reference: random
// blocks written by tools/gen_quant_blocks.py (run here, with the project's
// Python environment) next to their dequantization by the `gguf` package's
// numpy code, read back through kvserve's GGUF reader. Dequantization must
// equal the reference to the bit; the packed int8 matmul must match the
// float64 product of the reference values within the error of int8
// activations, on the VNNI, AVX2 and portable kernels, and for a fused matrix
// of mixed types (as K-quant mixes store Q, K and V).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "models/cpu/matmul.h"
#include "models/cpu/matmul_internal.h"
#include "models/cpu/quant_kernels.h"
#include "models/dequant.h"
#include "models/loader/gguf.h"

namespace kvserve::models {
namespace {

constexpr int64_t kRows = 37;
constexpr int64_t kCols = 512;

const char* const kTypes[] = {"Q4_0", "Q4_1", "Q5_0",   "Q5_1",
                              "Q8_0", "Q2_K", "Q3_K",   "Q4_K",
                              "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"};

class QuantTypesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/kvserve_quant_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    path_ = new std::string(std::string(dir) + "/blocks.gguf");
    const std::string cmd =
        absl::StrCat(KVSERVE_SOURCE_DIR "/.venv/bin/python " KVSERVE_SOURCE_DIR
                                        "/tools/gen_quant_blocks.py ",
                     *path_, " --rows ", kRows, " --cols ", kCols);
    ASSERT_EQ(std::system(cmd.c_str()), 0)
        << cmd << " (deploy/setup.sh makes .venv with the gguf package)";
    absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(*path_);
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = f->release();
  }
  static void TearDownTestSuite() {
    delete file_;
    if (path_ != nullptr) std::remove(path_->c_str());
    delete path_;
  }

  static RawTensor Get(const std::string& name) {
    absl::StatusOr<RawTensor> t = file_->GetTensor(name);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *t : RawTensor{};
  }
  static std::vector<float> Reference(const std::string& type) {
    absl::StatusOr<std::vector<float>> r = DequantizeTensor(Get(type + ".ref"));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : std::vector<float>{};
  }

  static std::string* path_;
  static GgufFile* file_;
};
std::string* QuantTypesTest::path_ = nullptr;
GgufFile* QuantTypesTest::file_ = nullptr;

// Normal with mean 1/2, so that the weights' offsets (mins) weigh in the
// product as they do after SiLU.
std::vector<float> RandomActivations(int64_t m, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.5f, 1.0f);
  std::vector<float> x(m * cols);
  for (float& v : x) v = dist(rng);
  return x;
}

// Largest |y - x W^T| over the outputs, relative to the largest |x| |W|^T
// (the scale of the error that int8 activations bring).
double RelativeError(const std::vector<float>& y, const std::vector<float>& w,
                     const std::vector<float>& x, int64_t m, int64_t rows) {
  double err = 0.0;
  double scale = 0.0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0.0;
      double mag = 0.0;
      for (int64_t k = 0; k < kCols; ++k) {
        ref += static_cast<double>(x[i * kCols + k]) * w[r * kCols + k];
        mag +=
            std::fabs(static_cast<double>(x[i * kCols + k]) * w[r * kCols + k]);
      }
      err = std::max(err, std::fabs(y[i * rows + r] - ref));
      scale = std::max(scale, mag);
    }
  }
  return err / scale;
}

TEST_F(QuantTypesTest, DequantizeEqualsGgufNumpyToTheBit) {
  for (const char* type : kTypes) {
    const RawTensor q = Get(absl::StrCat(type, ".q"));
    EXPECT_EQ(TypeName(q.type), type);
    absl::StatusOr<std::vector<float>> got = DequantizeTensor(q);
    ASSERT_TRUE(got.ok()) << type << ": " << got.status();
    const std::vector<float> ref = Reference(type);
    ASSERT_EQ(got->size(), ref.size()) << type;
    int64_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) differ += (*got)[i] != ref[i];
    EXPECT_EQ(differ, 0) << type << ": elements unlike gguf's dequantize";
  }
}

// One row at a time, as the embedding lookup reads it.
TEST_F(QuantTypesTest, RowDequantizeEqualsWholeTensor) {
  for (const char* type : kTypes) {
    const RawTensor q = Get(absl::StrCat(type, ".q"));
    const std::vector<float> ref = Reference(type);
    std::vector<float> row(kCols);
    for (int64_t r : {int64_t{0}, int64_t{17}, kRows - 1}) {
      ASSERT_TRUE(DequantizeTensorRow(q, r, row.data()).ok()) << type;
      for (int64_t k = 0; k < kCols; ++k) {
        ASSERT_EQ(row[k], ref[r * kCols + k]) << type << " " << r << " " << k;
      }
    }
  }
}

TEST_F(QuantTypesTest, MatMulMatchesFloat64Product) {
  for (const char* type : kTypes) {
    absl::StatusOr<cpu::PackedMatrix> w =
        cpu::PackMatrix(Get(absl::StrCat(type, ".q")));
    ASSERT_TRUE(w.ok()) << type << ": " << w.status();
    const std::vector<float> ref = Reference(type);
    for (int64_t m : {1, 3, 11}) {
      const std::vector<float> x = RandomActivations(m, kCols, 7 + m);
      std::vector<float> y(m * kRows);
      cpu::MatMul(x.data(), m, *w, y.data());
      // Measured: 0.04-0.13% for every type, about what int8 activations
      // alone give.
      EXPECT_LE(RelativeError(y, ref, x, m, kRows), 5e-3) << type << " m=" << m;
    }
  }
}

// Integer activations with 127 in every 32-block quantize to themselves, so
// the product is exact up to fp32 sums: the packed weights (scales, offsets,
// quants) must equal the reference, for every type.
TEST_F(QuantTypesTest, PackingIsExactOnInt8Activations) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> dist(-40, 127);  // offsets weigh in
  constexpr int64_t kM = 3;
  std::vector<float> x(kM * kCols);
  for (int64_t i = 0; i < kM * kCols; ++i) {
    x[i] = i % 32 == 0 ? 127.0f : static_cast<float>(dist(rng));
  }
  for (const char* type : kTypes) {
    absl::StatusOr<cpu::PackedMatrix> w =
        cpu::PackMatrix(Get(absl::StrCat(type, ".q")));
    ASSERT_TRUE(w.ok()) << type << ": " << w.status();
    std::vector<float> y(kM * kRows);
    cpu::MatMul(x.data(), kM, *w, y.data());
    // Measured: 1-3e-8.
    EXPECT_LE(RelativeError(y, Reference(type), x, kM, kRows), 1e-6) << type;
  }
}

// x with each `group` elements rounded to int8 times one scale, as ggml's
// Q8_0 (32) and Q8_K (256) quantize activations.
std::vector<float> Int8Rounded(const std::vector<float>& x, int group) {
  std::vector<float> out(x.size());
  for (size_t g = 0; g < x.size(); g += group) {
    float amax = 0.0f;
    for (int j = 0; j < group; ++j) amax = std::max(amax, std::fabs(x[g + j]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < group; ++j) {
      out[g + j] = std::nearbyint(x[g + j] * id) * (amax / 127.0f);
    }
  }
  return out;
}

// Each type's activations are quantized the way llama.cpp quantizes them for
// its dot product (vec_dot_type): per 256 (Q8_K) for the K-quants and
// IQ4_XS, per 32 (Q8_0 / Q8_1) for the others. Against the float64 product
// of the weights and activations rounded that way, only fp32 sums remain.
TEST_F(QuantTypesTest, ActivationsQuantizedAsLlamaCpp) {
  const std::vector<float> x = RandomActivations(3, kCols, 9);
  for (const char* type : kTypes) {
    const bool k_quant =
        absl::StrContains(type, "_K") || std::string(type) == "IQ4_XS";
    absl::StatusOr<cpu::PackedMatrix> w =
        cpu::PackMatrix(Get(absl::StrCat(type, ".q")));
    ASSERT_TRUE(w.ok()) << type << ": " << w.status();
    std::vector<float> y(3 * kRows);
    cpu::MatMul(x.data(), 3, *w, y.data());
    const std::vector<float> xq = Int8Rounded(x, k_quant ? 256 : 32);
    // Measured: 1-3e-8.
    EXPECT_LE(RelativeError(y, Reference(type), xq, 3, kRows), 1e-6) << type;
  }
}

// The AVX2 and portable kernels compute what the best ones (AVX-512 VNNI
// here) compute, up to fp32 rounding, for every kind; 5 activation rows
// cover the AVX2 kernels' passes of 4 and of 1.
TEST_F(QuantTypesTest, Avx2AndPortableKernelsMatchBest) {
  using cpu::internal::QuantIsa;
  ASSERT_TRUE(cpu::internal::HaveAvx2Kernels()) << "an x86 CPU with AVX2";
  for (const char* type : kTypes) {
    const RawTensor q = Get(absl::StrCat(type, ".q"));
    absl::StatusOr<cpu::internal::QuantTiles> tiles =
        cpu::internal::PackQuantTiles(q.type, q.data, kRows, kCols);
    ASSERT_TRUE(tiles.ok()) << type << ": " << tiles.status();
    const std::vector<float> x = RandomActivations(5, kCols, 3);
    cpu::internal::QuantizedActs simd, portable;
    const int group = tiles->ActGroup();
    cpu::internal::QuantizeActivations(x.data(), 5, kCols, &simd, false, group);
    cpu::internal::QuantizeActivations(x.data(), 5, kCols, &portable, true,
                                       group);
    std::vector<float> y1(5 * kRows), y2(5 * kRows), y3(5 * kRows);
    cpu::internal::QuantMatMul(simd, *tiles, y1.data());
    cpu::internal::QuantMatMul(portable, *tiles, y2.data(),
                               QuantIsa::kPortable);
    cpu::internal::QuantMatMul(simd, *tiles, y3.data(), QuantIsa::kAvx2);
    for (size_t i = 0; i < y1.size(); ++i) {
      ASSERT_NEAR(y1[i], y2[i], 1e-4f * (1.0f + std::fabs(y1[i])))
          << type << " portable " << i;
      ASSERT_NEAR(y1[i], y3[i], 1e-4f * (1.0f + std::fabs(y1[i])))
          << type << " avx2 " << i;
    }
  }
}

// Batches of more than one pass read each tile unpacked once into scratch
// (the kinds with bit planes or a code book); a row's result must equal, to
// the bit, that row alone through the packed tiles: 21 rows are two passes
// of 8 and a tail of 5.
TEST_F(QuantTypesTest, LargeBatchesEqualSingleRowsToTheBit) {
  constexpr int64_t kM = 21;
  const std::vector<float> x = RandomActivations(kM, kCols, 21);
  for (const char* type : kTypes) {
    absl::StatusOr<cpu::PackedMatrix> w =
        cpu::PackMatrix(Get(absl::StrCat(type, ".q")));
    ASSERT_TRUE(w.ok()) << type << ": " << w.status();
    std::vector<float> batch(kM * kRows);
    cpu::MatMul(x.data(), kM, *w, batch.data());
    std::vector<float> one(kRows);
    for (int64_t i = 0; i < kM; ++i) {
      cpu::MatMul(x.data() + i * kCols, 1, *w, one.data());
      ASSERT_EQ(0, std::memcmp(one.data(), batch.data() + i * kRows,
                               kRows * sizeof(float)))
          << type << " row " << i;
    }
  }
}

// The tile kind each type packs into and what it costs: within 4% of the
// file's bits per weight (Q4_K, Q5_K: +1/8, their 6-bit sub-scales and mins
// in bytes; Q3_K keeps its 6-bit sub-scales).
TEST_F(QuantTypesTest, PackedBitsPerWeight) {
  using cpu::internal::QuantKind;
  const struct {
    const char* type;
    QuantKind kind;
    double bits;
  } kCases[] = {{"Q4_0", QuantKind::kQ4_0, 4.5},
                {"Q4_1", QuantKind::kQ4_1, 5},
                {"Q5_0", QuantKind::kQ5_0, 5.5},
                {"Q5_1", QuantKind::kQ5_1, 6},
                {"Q8_0", QuantKind::kQ8_0, 8.5},
                {"Q2_K", QuantKind::kQ2_K, 2.625},
                {"Q3_K", QuantKind::kQ3_K, 3.4375},
                {"Q4_K", QuantKind::kQ4_K, 4.625},
                {"Q5_K", QuantKind::kQ5_K, 5.625},
                {"Q6_K", QuantKind::kQ6_K, 6.5625},
                {"IQ4_NL", QuantKind::kIQ4_NL, 4.5},
                {"IQ4_XS", QuantKind::kIQ4_XS, 4.3125}};
  for (const auto& c : kCases) {
    const RawTensor q = Get(absl::StrCat(c.type, ".q"));
    absl::StatusOr<cpu::internal::QuantTiles> tiles =
        cpu::internal::PackQuantTiles(q.type, q.data, kRows, kCols);
    ASSERT_TRUE(tiles.ok()) << c.type << ": " << tiles.status();
    EXPECT_EQ(tiles->kind, c.kind) << c.type;
    // Per weight of the padded rows (tiles of 16), before the tile's
    // alignment to 64 bytes.
    const double weights = static_cast<double>(
        tiles->num_tiles * cpu::internal::kTileRows * kCols);
    EXPECT_NEAR(8.0 * static_cast<double>(tiles->buf.size()) / weights, c.bits,
                0.01)
        << c.type;
  }
}

// Rows of several types in one matrix, each output row as its own type's:
// one segment per run of a type.
TEST_F(QuantTypesTest, MixedTypesFuseIntoOneMatrix) {
  using Mix = std::pair<std::vector<std::string>, size_t>;
  for (const auto& [mix, segments] :
       {Mix{{"Q4_K", "Q6_K", "Q5_0"}, 3}, Mix{{"Q4_K", "Q4_K", "Q6_K"}, 2},
        Mix{{"Q5_K", "Q4_0", "Q5_1", "Q4_1", "Q8_0"}, 5},
        Mix{{"Q6_K", "IQ4_XS", "IQ4_NL", "Q2_K", "Q3_K"}, 5}}) {
    std::vector<RawTensor> parts;
    std::vector<cpu::internal::QuantRows> rows_of;
    std::vector<float> ref;
    for (const std::string& type : mix) {
      parts.push_back(Get(type + ".q"));
      rows_of.push_back({parts.back().type, parts.back().data, kRows});
      const std::vector<float> r = Reference(type);
      ref.insert(ref.end(), r.begin(), r.end());
    }
    absl::StatusOr<cpu::internal::QuantTiles> tiles =
        cpu::internal::PackQuantTiles(rows_of, kCols);
    ASSERT_TRUE(tiles.ok()) << tiles.status();
    EXPECT_EQ(tiles->segments.size(), segments) << mix[0];
    absl::StatusOr<cpu::PackedMatrix> w = cpu::PackQuantizedRows(parts);
    ASSERT_TRUE(w.ok()) << w.status();
    const int64_t rows = kRows * static_cast<int64_t>(mix.size());
    ASSERT_EQ(w->rows(), rows);
    const std::vector<float> x = RandomActivations(4, kCols, 11);
    std::vector<float> y(4 * rows);
    cpu::MatMul(x.data(), 4, *w, y.data());
    EXPECT_LE(RelativeError(y, ref, x, 4, rows), 5e-3) << mix[0];
    // The portable and AVX2 kernels walk the segments the same way.
    cpu::internal::QuantizedActs a32, a256;
    cpu::internal::QuantizeActivations(x.data(), 4, kCols, &a32, true);
    cpu::internal::QuantizeActivations(x.data(), 4, kCols, &a256, true, 256);
    std::vector<float> y2(4 * rows);
    cpu::internal::QuantMatMul({&a32, &a256}, *tiles, y2.data(),
                               cpu::internal::QuantIsa::kPortable);
    EXPECT_LE(RelativeError(y2, ref, x, 4, rows), 5e-3) << mix[0];
    cpu::internal::QuantMatMul({&a32, &a256}, *tiles, y2.data(),
                               cpu::internal::QuantIsa::kAvx2);
    EXPECT_LE(RelativeError(y2, ref, x, 4, rows), 5e-3) << mix[0];
  }
}

// A K-quant file whose per-256 scale is NaN or infinite (corrupt or
// hostile) packs without a crash, and the rows it scales come out NaN as
// their dequantized values do; the other rows are unaffected.
TEST_F(QuantTypesTest, NonFiniteSuperScalesGiveNaNRows) {
  for (const auto& [type, d_offset] :
       {std::pair<std::string, size_t>{"Q4_K", 0}, {"Q6_K", 208}}) {
    const RawTensor q = Get(type + ".q");
    std::vector<uint8_t> bytes(static_cast<const uint8_t*>(q.data),
                               static_cast<const uint8_t*>(q.data) + q.nbytes);
    const size_t row_bytes = q.nbytes / kRows;
    const uint16_t nan = 0x7e00, inf = 0x7c00;
    std::memcpy(&bytes[d_offset], &nan, 2);              // row 0
    std::memcpy(&bytes[row_bytes + d_offset], &inf, 2);  // row 1
    RawTensor bad = q;
    bad.data = bytes.data();
    absl::StatusOr<cpu::PackedMatrix> w = cpu::PackMatrix(bad);
    ASSERT_TRUE(w.ok()) << type << ": " << w.status();
    const std::vector<float> x = RandomActivations(1, kCols, 4);
    std::vector<float> y(kRows);
    cpu::MatMul(x.data(), 1, *w, y.data());
    EXPECT_TRUE(std::isnan(y[0])) << type;
    EXPECT_FALSE(std::isfinite(y[1])) << type;
    for (int64_t r = 2; r < kRows; ++r) {
      EXPECT_TRUE(std::isfinite(y[r])) << type << " " << r;
    }
  }
}

TEST_F(QuantTypesTest, MixedRowsOfDifferentWidthAreRefused) {
  RawTensor a = Get("Q4_K.q");
  RawTensor b = Get("Q6_K.q");
  b.shape = {256, 2 * kRows};  // same bytes, half-width rows
  absl::StatusOr<cpu::PackedMatrix> w = cpu::PackQuantizedRows({a, b});
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), ::testing::HasSubstr("Q6_K.q"));
}

}  // namespace
}  // namespace kvserve::models
