// FastDiv (models/cuda/fast_div.h), the divide-free quotient the CUDA
// attention kernel uses for block-table lookups, equals integer division for
// every block size the server accepts and a wide range of dividends.
#include "models/cuda/fast_div.h"

#include <cstdint>
#include <random>

#include "gtest/gtest.h"

namespace kvserve::models::cuda {
namespace {

TEST(FastDiv, EqualsDivisionForEveryBlockSize) {
  std::mt19937 rng(1);
  for (int32_t d = 1; d <= 1024; ++d) {  // --block-size range
    const FastDiv f(d);
    for (int32_t n = 0; n < (1 << 16); ++n) {
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
    }
    for (int i = 0; i < 4096; ++i) {
      const int32_t n = static_cast<int32_t>(rng() & 0x7fffffffu);
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
    }
    ASSERT_EQ(f.Div(INT32_MAX), INT32_MAX / d) << d;
  }
}

TEST(FastDiv, LargeDivisors) {
  std::mt19937 rng(2);
  for (int i = 0; i < 2000; ++i) {
    const int32_t d = 1 + static_cast<int32_t>(rng() & 0x7ffffffeu);
    const FastDiv f(d);
    for (int j = 0; j < 200; ++j) {
      const int32_t n = static_cast<int32_t>(rng() & 0x7fffffffu);
      ASSERT_EQ(f.Div(n), n / d) << n << " / " << d;
    }
    ASSERT_EQ(f.Div(d - 1), 0);
    ASSERT_EQ(f.Div(d), 1);
  }
}

}  // namespace
}  // namespace kvserve::models::cuda
