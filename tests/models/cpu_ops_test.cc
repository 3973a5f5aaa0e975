// Tests of models/cpu/ops.h against double-precision scalar references, at
// lengths that exercise full vectors and masked tails.
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "models/cpu/ops.h"

namespace kvserve::models::cpu {
namespace {

constexpr int64_t kLengths[] = {1, 5, 16, 17, 31, 64, 100, 576, 1537};

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

TEST(CpuOpsTest, RmsNorm) {
  for (int64_t n : kLengths) {
    const std::vector<float> x = Random(n, 1, 3.0f);
    const std::vector<float> w = Random(n, 2);
    double ss = 0;
    for (float v : x) ss += double{v} * v;
    const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
    std::vector<float> out(n);
    RmsNorm(x.data(), w.data(), n, 1e-5f, out.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(out[i], x[i] * scale * w[i], 1e-5 * (1 + std::fabs(out[i])))
          << "n=" << n << " i=" << i;
    }
    std::vector<float> inplace = x;
    RmsNorm(inplace.data(), w.data(), n, 1e-5f, inplace.data());
    EXPECT_EQ(inplace, out) << "n=" << n;
  }
}

TEST(CpuOpsTest, SiluMul) {
  for (int64_t n : kLengths) {
    std::vector<float> g = Random(n, 3, 4.0f);
    if (n > 4) g[0] = 100.0f, g[1] = -100.0f, g[2] = 0.0f, g[3] = -30.0f;
    const std::vector<float> u = Random(n, 4);
    std::vector<float> out(n);
    SiluMul(g.data(), u.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const double ref = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
      ASSERT_NEAR(out[i], ref, 2e-6 * (1 + std::fabs(ref)))
          << "n=" << n << " g=" << g[i];
    }
    std::vector<float> inplace = g;
    SiluMul(inplace.data(), u.data(), n, inplace.data());
    EXPECT_EQ(inplace, out);
  }
}

TEST(CpuOpsTest, DotAndAxpy) {
  for (int64_t n : kLengths) {
    const std::vector<float> a = Random(n, 5);
    const std::vector<float> b = Random(n, 6);
    double ref = 0, mag = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += double{a[i]} * b[i];
      mag += std::fabs(double{a[i]} * b[i]);
    }
    EXPECT_NEAR(Dot(a.data(), b.data(), n), ref, 1e-6 * mag) << "n=" << n;

    std::vector<float> y = b;
    Axpy(-0.75f, a.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double ref = -0.75 * a[i] + b[i];
      ASSERT_NEAR(y[i], ref, 2e-7 * (0.75 * std::fabs(a[i]) + std::fabs(b[i])))
          << "n=" << n;
    }
  }
  EXPECT_EQ(Dot(nullptr, nullptr, 0), 0.0f);
}

TEST(CpuOpsTest, Softmax) {
  for (int64_t n : kLengths) {
    std::vector<float> x = Random(n, 7, 5.0f);
    const std::vector<float> in = x;
    Softmax(x.data(), n);
    double max = -1e30, sum = 0;
    for (float v : in) max = std::max(max, double{v});
    for (float v : in) sum += std::exp(v - max);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double ref = std::exp(in[i] - max) / sum;
      ASSERT_NEAR(x[i], ref, 1e-5 * ref + 1e-9) << "n=" << n;
      total += x[i];
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
}

TEST(CpuOpsTest, SoftmaxMaskedAndExtreme) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = {1.0f, -inf, 2.0f, -inf, -1000.0f, 1e4f,
                          1e4f, -inf, 0.0f, -inf, -inf,     -inf,
                          -inf, -inf, -inf, -inf, -inf,     3.0f};
  Softmax(x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    if (i == 5 || i == 6) {
      EXPECT_FLOAT_EQ(x[i], 0.5f);
    } else {
      EXPECT_EQ(x[i], 0.0f) << i;
    }
  }
  std::vector<float> one = {-inf, 7.0f, -inf};
  Softmax(one.data(), 3);
  EXPECT_EQ(one, (std::vector<float>{0.0f, 1.0f, 0.0f}));
}

// Against the matrix written out, H[i][j] = (-1)^popcount(i & j) / sqrt(n),
// chunk by chunk; and H H = I.
TEST(CpuOpsTest, HadamardRotateIsTheOrthonormalMatrixAndItsOwnInverse) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int n : {1, 2, 8, 16, 32, 64, 128}) {
    const int chunks = 3;
    std::vector<float> x(n * chunks);
    for (float& v : x) v = dist(rng);
    std::vector<float> y = x;
    HadamardRotate(y.data(), static_cast<int64_t>(y.size()), n);
    for (int c = 0; c < chunks; ++c) {
      for (int i = 0; i < n; ++i) {
        double want = 0;
        for (int j = 0; j < n; ++j) {
          const int sign = __builtin_popcount(i & j) % 2 ? -1 : 1;
          want += sign * static_cast<double>(x[c * n + j]);
        }
        want /= std::sqrt(static_cast<double>(n));
        EXPECT_NEAR(y[c * n + i], want, 1e-5 * (1 + std::fabs(want)))
            << "n " << n << " chunk " << c << " i " << i;
      }
    }
    HadamardRotate(y.data(), static_cast<int64_t>(y.size()), n);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(y[i], x[i], 1e-5 * (1 + std::fabs(x[i]))) << "n " << n;
    }
  }
}

}  // namespace
}  // namespace kvserve::models::cpu
