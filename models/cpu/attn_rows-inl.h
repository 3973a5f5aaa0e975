// The score and accumulate kernels of the CPU attention
// (models/cpu/paged_attention.cc, its only includer, which includes Highway
// and kv_tile_rows-inl.h first): R query rows against a tile's keys, and a
// tile's softmax weights times its V rows, over any row source, in a fixed
// order of operations so that a result does not depend on the rows beside
// it or where its keys were read from.
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/cpu/tile_prefetcher.h"

// Fully unrolls a loop of compile-time trip count so that arrays of
// vectors indexed by its counter stay in registers.
#define KV_UNROLL _Pragma("GCC unroll 16")

namespace kvserve::models::cpu_attn {

// Sums of the lanes of x[0, V) (V = lanes) as one vector, lane j the sum
// of x[j]: log2(V) levels of adding adjacent lanes, so each sum is the same
// balanced tree over its vector's lanes in order, whatever j is.
HWY_INLINE hn::Vec<DF> SumEachOfLanes(hn::Vec<DF>* x) {
  const DF d;
  KV_UNROLL
  for (size_t n = hn::MaxLanes(d); n > 1; n /= 2) {
    KV_UNROLL
    for (size_t i = 0; i < n / 2; ++i) {
      x[i] = hn::Add(hn::ConcatEven(d, x[2 * i + 1], x[2 * i]),
                     hn::ConcatOdd(d, x[2 * i + 1], x[2 * i]));
    }
  }
  return x[0];
}

// R query rows (stride dp) against keys [0, n) of a page:
// sc[r * sc_stride + t] = q_r . k_t. Every score is the same chain, a
// lane-wise FMA over the row's vectors in order and then the lane tree of
// SumEachOfLanes, so it does not depend on R, the page source or the rows
// beside it. Keys go kKeys at a time (R * kKeys <= lanes accumulators; the
// last group repeats key n - 1 and drops it). NC > 0 fixes the vectors per
// row at compile time; 0 reads `nc`.
template <int R, int NC, typename Src>
void ScoreRows(const float* q, int dp, int nc, const Src& k, int n, float* sc,
               int64_t sc_stride, TilePrefetcher* pf) {
  const DF d;
  constexpr int kLanes = static_cast<int>(hn::MaxLanes(DF()));
  constexpr int kRows = R == 1 ? 1 : R == 2 ? 2 : 4;  // R rounded to 2^k
  constexpr int kKeys = kLanes / kRows > 0 ? kLanes / kRows : 1;
  static_assert(kRows * kKeys == kLanes, "one accumulator per lane");
  if constexpr (NC > 0) nc = NC;
  // The query rows in registers when their size is known.
  constexpr int kQ = NC > 0 ? R * NC : 1;
  hn::Vec<DF> qv[kQ];
  if constexpr (NC > 0) {
    KV_UNROLL
    for (int i = 0; i < kQ; ++i) {
      qv[i] = hn::LoadU(d, q + (i / NC) * dp + (i % NC) * kLanes);
    }
  }
  auto qload = [&](int r, int c) HWY_ATTR {
    if constexpr (NC > 0) {
      return qv[r * NC + c];
    } else {
      return hn::LoadU(d, q + r * dp + c * kLanes);
    }
  };
  HWY_ALIGN float out[kLanes];
  TilePrefetcher lp = *pf;  // in registers across the loop
  for (int t0 = 0; t0 < n; t0 += kKeys) {
    lp.Step();
    hn::Vec<DF> acc[kLanes];
    KV_UNROLL
    for (int a = 0; a < kLanes; ++a) acc[a] = hn::Zero(d);
    KV_UNROLL
    for (int j = 0; j < kKeys; ++j) {
      const int t = std::min(t0 + j, n - 1);
      KV_UNROLL
      for (int c = 0; c < nc; ++c) {
        const auto kv = k.Load(t, c);
        KV_UNROLL
        for (int r = 0; r < R; ++r) {
          acc[r * kKeys + j] = hn::MulAdd(qload(r, c), kv, acc[r * kKeys + j]);
        }
      }
    }
    hn::Store(SumEachOfLanes(acc), d, out);
    const int m = std::min(kKeys, n - t0);
    for (int r = 0; r < R; ++r) {
      std::copy_n(out + r * kKeys, m, sc + r * sc_stride + t0);
    }
  }
  *pf = lp;
}

// acc_r += p[r * p_stride + t] * v_t for keys t in [t0, t1) in order, R
// rows at once (accumulators in registers for NC > 0). Per element the same
// FMA sequence as one row alone.
template <int R, int NC, typename Src>
void AccumRows(const float* p, int64_t p_stride, const Src& v, int dp, int nc,
               int t0, int t1, float* acc, TilePrefetcher* pf) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  if constexpr (NC > 0) {
    hn::Vec<DF> a[R][NC];
    KV_UNROLL
    for (int r = 0; r < R; ++r) {
      KV_UNROLL
      for (int c = 0; c < NC; ++c) {
        a[r][c] = hn::LoadU(d, acc + r * dp + c * lanes);
      }
    }
    TilePrefetcher lp = *pf;  // in registers across the loop
    for (int t = t0; t < t1; ++t) {
      lp.Step();
      KV_UNROLL
      for (int c = 0; c < NC; ++c) {
        const auto vc = v.Load(t, c);
        KV_UNROLL
        for (int r = 0; r < R; ++r) {
          a[r][c] = hn::MulAdd(hn::Set(d, p[r * p_stride + t]), vc, a[r][c]);
        }
      }
    }
    *pf = lp;
    KV_UNROLL
    for (int r = 0; r < R; ++r) {
      KV_UNROLL
      for (int c = 0; c < NC; ++c) {
        hn::StoreU(a[r][c], d, acc + r * dp + c * lanes);
      }
    }
  } else {
    KV_UNROLL
    for (int r = 0; r < R; ++r) {
      float* ar = acc + r * dp;
      for (int t = t0; t < t1; ++t) {
        pf->Step();
        const auto pv = hn::Set(d, p[r * p_stride + t]);
        for (int c = 0; c < nc; ++c) {
          hn::StoreU(hn::MulAdd(pv, v.Load(t, c), hn::LoadU(d, ar + c * lanes)),
                     d, ar + c * lanes);
        }
      }
    }
  }
}

// Calls Op<R, NC>::Run(args...) for a row block of R = 1..4 rows and the
// compile-time vector count matching nc (0: run time).
template <template <int, int> class Op, int NC, typename... Args>
void ForRows(int rows, Args&&... args) {
  switch (rows) {
    case 1:
      Op<1, NC>::Run(args...);
      break;
    case 2:
      Op<2, NC>::Run(args...);
      break;
    case 3:
      Op<3, NC>::Run(args...);
      break;
    default:
      Op<4, NC>::Run(args...);
      break;
  }
}
template <template <int, int> class Op, typename... Args>
void ForRowsNc(int rows, int nc, Args&&... args) {
  switch (nc) {
    case 2:
      ForRows<Op, 2>(rows, args...);
      break;
    case 4:
      ForRows<Op, 4>(rows, args...);
      break;
    case 8:
      ForRows<Op, 8>(rows, args...);
      break;
    default:
      ForRows<Op, 0>(rows, args...);
      break;
  }
}
template <int R, int NC>
struct ScoreOp {
  template <typename Src>
  static void Run(const float* q, int dp, int nc, const Src& k, int n,
                  float* sc, int64_t sc_stride, TilePrefetcher* pf) {
    ScoreRows<R, NC>(q, dp, nc, k, n, sc, sc_stride, pf);
  }
};
template <int R, int NC>
struct AccumOp {
  template <typename Src>
  static void Run(const float* p, int64_t p_stride, const Src& v, int dp,
                  int nc, int t0, int t1, float* acc, TilePrefetcher* pf) {
    AccumRows<R, NC>(p, p_stride, v, dp, nc, t0, t1, acc, pf);
  }
};

}  // namespace kvserve::models::cpu_attn
