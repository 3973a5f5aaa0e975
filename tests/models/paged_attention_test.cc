// The CPU paged attention kernel against a float64 dense reference, for
// every KV dtype and shape (MHA, GQA, MQA; block sizes; head_dim off the
// vector width; shuffled block tables; mixed prefill, chunked prefill and
// decode; sliding window; sinks scored by a second query), and its
// invariance: a sequence's result is the
// same bits alone or in a batch, split into chunks or not, on 1 or 2
// threads.
#include "models/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/parallel.h"
#include "gtest/gtest.h"
#include "kvcache/kv_sizing.h"
#include "models/cpu/kv_rows.h"
#include "models/forward_batch.h"
#include "models/kv_view.h"

namespace kvserve::models {
namespace {

using kvcache::KvDtype;

struct Shape {
  int h, hkv, d, bs, window;
};

// A sequence in the batch: `n` query tokens ending at position ctx - 1.
struct Seq {
  int32_t ctx, n;
};

// A paged cache of one layer holding random K/V for every position of every
// sequence, each sequence on a shuffled set of blocks.
class Cache {
 public:
  Cache(const Shape& s, KvDtype dtype, const std::vector<Seq>& seqs,
        uint32_t seed)
      : s_(s), dtype_(dtype) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    max_blocks_ = 0;
    for (const Seq& q : seqs) {
      max_blocks_ = std::max(max_blocks_, (q.ctx + s.bs - 1) / s.bs);
    }
    num_blocks_ = max_blocks_ * static_cast<int32_t>(seqs.size());
    std::vector<int32_t> perm(num_blocks_);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    tables_.assign(static_cast<size_t>(seqs.size()) * max_blocks_, 0);
    for (size_t i = 0; i < tables_.size(); ++i) tables_[i] = perm[i];
    row_bytes_ = kvcache::KvRowBytes(dtype, s.d);
    const int64_t slots = static_cast<int64_t>(num_blocks_) * s.bs;
    k_bytes_.assign(slots * s.hkv * row_bytes_, std::byte{0});
    v_bytes_.assign(slots * s.hkv * row_bytes_, std::byte{0});
    for (size_t q = 0; q < seqs.size(); ++q) {
      for (int32_t t = 0; t < seqs[q].ctx; ++t) {
        for (int h = 0; h < s.hkv; ++h) {
          std::vector<float> k(s.d), v(s.d);
          for (float& x : k) x = u(rng);
          for (float& x : v) x = u(rng);
          if (!KeyGroups()) {
            cpu::EncodeKvRow(dtype, k.data(), s.d, Row(k_bytes_, q, t, h));
          }
          cpu::EncodeKvRow(dtype, v.data(), s.d, Row(v_bytes_, q, t, h));
          orig_k_[Key(q, t, h)] = k;
          orig_v_[Key(q, t, h)] = v;
        }
      }
      if (KeyGroups()) EncodeKeyGroups(q, seqs[q].ctx);
    }
  }

  KvCacheView View() {
    KvCacheView v;
    v.num_blocks = num_blocks_;
    v.block_size = s_.bs;
    v.num_kv_heads = s_.hkv;
    v.head_dim = s_.d;
    v.dtype = dtype_;
    v.k = {k_bytes_.data()};
    v.v = {v_bytes_.data()};
    return v;
  }

  // Decoded (as stored) or original values of one row.
  std::vector<float> K(size_t q, int32_t t, int h, bool stored) {
    if (!stored) return orig_k_[Key(q, t, h)];
    if (!KeyGroups()) return Decode(k_bytes_, q, t, h);
    constexpr int kTokens = kvcache::kKvKeyGroupTokens;
    std::vector<float> out(s_.d);
    cpu::DecodeKvKeyRow(dtype_, Row(k_bytes_, q, t - t % kTokens, h),
                        s_.hkv * row_bytes_, t % kTokens, s_.d, out.data());
    return out;
  }
  std::vector<float> V(size_t q, int32_t t, int h, bool stored) {
    return stored ? Decode(v_bytes_, q, t, h) : orig_v_[Key(q, t, h)];
  }
  const int32_t* Table(size_t q) const {
    return tables_.data() + q * max_blocks_;
  }
  int32_t max_blocks() const { return max_blocks_; }

 private:
  bool KeyGroups() const { return kvcache::KvLowBits(dtype_) > 0; }
  // int3/int2 keys, a key group of 32 positions at a time (the last one of
  // the sequence partly filled, as a sequence's newest group is).
  void EncodeKeyGroups(size_t q, int32_t ctx) {
    constexpr int kTokens = kvcache::kKvKeyGroupTokens;
    const int64_t stride = s_.hkv * row_bytes_;
    for (int32_t g = 0; g < ctx; g += kTokens) {
      const int n = std::min(kTokens, ctx - g);
      for (int h = 0; h < s_.hkv; ++h) {
        std::vector<float> x;
        for (int j = 0; j < n; ++j) {
          const auto& k = orig_k_[Key(q, g + j, h)];
          x.insert(x.end(), k.begin(), k.end());
        }
        cpu::EncodeKvKeyGroup(dtype_, x.data(), s_.d, n, s_.d,
                              Row(k_bytes_, q, g, h), stride);
      }
    }
  }
  std::byte* Row(std::vector<std::byte>& plane, size_t q, int32_t t, int h) {
    const int64_t slot =
        static_cast<int64_t>(Table(q)[t / s_.bs]) * s_.bs + t % s_.bs;
    return plane.data() + (slot * s_.hkv + h) * row_bytes_;
  }
  std::vector<float> Decode(std::vector<std::byte>& plane, size_t q, int32_t t,
                            int h) {
    std::vector<float> out(s_.d);
    cpu::DecodeKvRow(dtype_, Row(plane, q, t, h), s_.d, out.data());
    return out;
  }
  int64_t Key(size_t q, int32_t t, int h) const {
    return (static_cast<int64_t>(q) * 1000000 + t) * 64 + h;
  }

  Shape s_;
  KvDtype dtype_;
  int32_t max_blocks_ = 0, num_blocks_ = 0;
  int64_t row_bytes_ = 0;
  std::vector<int32_t> tables_;
  std::vector<std::byte> k_bytes_, v_bytes_;
  std::map<int64_t, std::vector<float>> orig_k_, orig_v_;
};

// The batch of `seqs` (indices into the cache's sequences), queries `q`.
ForwardBatch MakeBatch(Cache& cache, const std::vector<Seq>& all,
                       const std::vector<size_t>& seqs) {
  ForwardBatch b;
  b.seq_starts = {0};
  b.max_blocks_per_seq = cache.max_blocks();
  for (size_t q : seqs) {
    for (int32_t t = all[q].ctx - all[q].n; t < all[q].ctx; ++t) {
      b.token_ids.push_back(1);
      b.positions.push_back(t);
    }
    b.seq_starts.push_back(b.num_tokens());
    b.context_lens.push_back(all[q].ctx);
    b.block_tables.insert(b.block_tables.end(), cache.Table(q),
                          cache.Table(q) + cache.max_blocks());
  }
  return b;
}

std::vector<float> RandomQ(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> q(n);
  for (float& x : q) x = u(rng);
  return q;
}

// float64 attention of query row (seq q, position t, head h); keys below
// sink_len scored by qsink instead.
std::vector<double> Reference(const Shape& s, Cache& cache, size_t q, int32_t t,
                              int h, const float* qrow, const float* qsink,
                              int32_t sink_len, bool stored) {
  const int kvh = h / (s.h / s.hkv);
  const int32_t lo = s.window > 0 ? std::max(0, t - s.window + 1) : 0;
  std::vector<double> sc;
  double mx = -INFINITY;
  for (int32_t k = lo; k <= t; ++k) {
    const std::vector<float> kr = cache.K(q, k, kvh, stored);
    const float* qr = k < sink_len ? qsink : qrow;
    double dot = 0;
    for (int e = 0; e < s.d; ++e) dot += static_cast<double>(qr[e]) * kr[e];
    sc.push_back(dot / std::sqrt(static_cast<double>(s.d)));
    mx = std::max(mx, sc.back());
  }
  double l = 0;
  std::vector<double> out(s.d, 0.0);
  for (int32_t k = lo; k <= t; ++k) {
    const double p = std::exp(sc[k - lo] - mx);
    l += p;
    const std::vector<float> vr = cache.V(q, k, kvh, stored);
    for (int e = 0; e < s.d; ++e) out[e] += p * vr[e];
  }
  for (double& x : out) x /= l;
  return out;
}

struct Errors {
  double vs_stored = 0, vs_original = 0;
};

std::vector<float> RunKernel(const Shape& s, const ForwardBatch& b,
                             const std::vector<float>& q, int64_t q_stride,
                             const KvCacheView& kv,
                             const float* q_sink = nullptr) {
  std::vector<float> out(static_cast<size_t>(b.num_tokens()) * s.h * s.d, NAN);
  PagedAttention(
      {s.h, s.hkv, s.d, 1.0f / std::sqrt(static_cast<float>(s.d)), s.window}, b,
      q.data(), q_sink, q_stride, kv, 0, out.data());
  return out;
}

// Max abs error of the kernel against both references over a mixed batch.
// `sinks`: two of its sequences score their first blocks (3 and 5 of them,
// the latter across a 64-key tile) with a second query.
Errors Measure(const Shape& s, KvDtype dtype, uint32_t seed, bool sinks) {
  const std::vector<Seq> seqs = {{40, 40}, {320, 20}, {701, 1}, {35, 1}};
  Cache cache(s, dtype, seqs, seed);
  ForwardBatch b = MakeBatch(cache, seqs, {0, 1, 2, 3});
  if (sinks) b.sink_lens = {0, 3 * s.bs, 5 * s.bs, 0};
  const int64_t q_stride = static_cast<int64_t>(s.h + 2 * s.hkv) * s.d;
  const std::vector<float> q = RandomQ(b.num_tokens() * q_stride, seed + 1);
  const std::vector<float> qs = RandomQ(b.num_tokens() * q_stride, seed + 2);
  const std::vector<float> out =
      RunKernel(s, b, q, q_stride, cache.View(), sinks ? qs.data() : nullptr);
  Errors e;
  for (int32_t sq = 0; sq < b.num_seqs(); ++sq) {
    for (int32_t i = b.seq_starts[sq]; i < b.seq_starts[sq + 1]; ++i) {
      for (int h = 0; h < s.h; ++h) {
        const float* qrow = q.data() + i * q_stride + h * s.d;
        const float* qsink = qs.data() + i * q_stride + h * s.d;
        const float* got =
            out.data() + (static_cast<int64_t>(i) * s.h + h) * s.d;
        const int32_t t = b.positions[i], sl = b.SinkLen(sq);
        const auto want_s =
            Reference(s, cache, sq, t, h, qrow, qsink, sl, true);
        const auto want_o =
            Reference(s, cache, sq, t, h, qrow, qsink, sl, false);
        for (int d = 0; d < s.d; ++d) {
          e.vs_stored = std::max(e.vs_stored, std::fabs(got[d] - want_s[d]));
          e.vs_original =
              std::max(e.vs_original, std::fabs(got[d] - want_o[d]));
        }
      }
    }
  }
  return e;
}

// Tolerances: max abs error on outputs of V rows uniform in [-1, 1].
// Against the stored (decoded) values the kernel's float32 arithmetic
// measured <= 3.5e-7 for every dtype and shape below: 2e-6. Against the
// original float values, measured maxima: f32 1.6e-7, fp16 3.0e-4, bf16
// 3.5e-3, int8 4.8e-3, int4 0.117, int3 0.181, int2 0.429 (keys per
// channel over 32 uniform tokens, the sequences' last groups partly
// filled); the tolerances are about twice that.
double OriginalTolerance(KvDtype d) {
  switch (d) {
    case KvDtype::kF32:
      return 2e-6;
    case KvDtype::kF16:
      return 6e-4;
    case KvDtype::kBF16:
      return 7e-3;
    case KvDtype::kInt8:
      return 1e-2;
    case KvDtype::kInt4:
      return 0.25;
    case KvDtype::kInt3:
      return 0.4;
    case KvDtype::kInt2:
      return 0.9;
    default:
      return 0;
  }
}

class PagedAttentionTest
    : public testing::TestWithParam<std::tuple<KvDtype, Shape>> {};

TEST_P(PagedAttentionTest, MatchesFloat64Reference) {
  const auto [dtype, shape] = GetParam();
  for (const bool sinks : {false, true}) {
    const Errors e = Measure(shape, dtype, 7, sinks);
    RecordProperty(sinks ? "max_err_vs_stored_sinks" : "max_err_vs_stored",
                   std::to_string(e.vs_stored));
    std::printf(
        "%s h=%d hkv=%d d=%d bs=%d window=%d sinks=%d: vs stored %.3g, vs "
        "original %.3g\n",
        std::string(kvcache::KvDtypeName(dtype)).c_str(), shape.h, shape.hkv,
        shape.d, shape.bs, shape.window, sinks, e.vs_stored, e.vs_original);
    EXPECT_LT(e.vs_stored, 2e-6) << "sinks " << sinks;
    EXPECT_LT(e.vs_original, OriginalTolerance(dtype)) << "sinks " << sinks;
  }
}

// Every dtype with every shape it can store (int8 and int4 need whole
// 32-element groups).
std::vector<std::tuple<KvDtype, Shape>> Cases() {
  const Shape shapes[] = {
      {9, 3, 64, 16, 0},     // GQA (SmolLM2)
      {4, 4, 32, 24, 0},     // MHA, 24-token blocks
      {8, 1, 128, 16, 0},    // MQA, Llama's head_dim
      {6, 2, 40, 7, 0},      // head_dim off the vector width, 7-token blocks
      {4, 2, 64, 16, 37},    // sliding window
      {9, 3, 64, 32, 0},     // GQA, 32-token blocks (whole int3/int2 groups)
      {4, 2, 128, 64, 37}};  // sliding window, 64-token blocks
  std::vector<std::tuple<KvDtype, Shape>> out;
  for (KvDtype d :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8,
        KvDtype::kInt4, KvDtype::kInt3, KvDtype::kInt2}) {
    for (const Shape& s : shapes) {
      if (kvcache::CheckKvDtypeShape(d, s.d).ok() &&
          kvcache::CheckKvDtypeBlockSize(d, s.bs).ok()) {
        out.emplace_back(d, s);
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndShapes, PagedAttentionTest,
                         testing::ValuesIn(Cases()));

// The softmax weights of query row (seq q, position t, head h) over keys
// [0, t] as stored, keys below sink_len scored by qsink (no sliding window).
std::vector<double> RefWeights(const Shape& s, Cache& cache, size_t q,
                               int32_t t, int h, const float* qrow,
                               const float* qsink, int32_t sink_len) {
  const int kvh = h / (s.h / s.hkv);
  std::vector<double> w(t + 1);
  double mx = -INFINITY, l = 0;
  for (int32_t k = 0; k <= t; ++k) {
    const std::vector<float> kr = cache.K(q, k, kvh, true);
    const float* qr = k < sink_len ? qsink : qrow;
    double dot = 0;
    for (int e = 0; e < s.d; ++e) dot += static_cast<double>(qr[e]) * kr[e];
    w[k] = dot / std::sqrt(static_cast<double>(s.d));
    mx = std::max(mx, w[k]);
  }
  for (double& x : w) l += (x = std::exp(x - mx));
  for (double& x : w) x /= l;
  return w;
}

// Attention mass per block (a heavy-hitters policy's input): the weights
// each asking sequence's rows gave the keys of each of its table entries,
// summed over rows and heads, against float64; a sequence that did not ask
// gets zeros. Prefill, chunked prefill and decode rows, sinks on two of them.
TEST(PagedAttentionMass, BlockMassMatchesFloat64Weights) {
  for (const auto& [dtype, s] :
       {std::pair{KvDtype::kF16, Shape{9, 3, 64, 16, 0}},
        std::pair{KvDtype::kF32, Shape{6, 2, 40, 7, 0}}}) {
    const std::vector<Seq> seqs = {{40, 40}, {320, 20}, {701, 1}, {35, 1}};
    Cache cache(s, dtype, seqs, 21);
    ForwardBatch b = MakeBatch(cache, seqs, {0, 1, 2, 3});
    b.sink_lens = {0, 3 * s.bs, 5 * s.bs, 0};
    b.mass_seqs = {1, 1, 1, 0};
    const int64_t q_stride = static_cast<int64_t>(s.h + 2 * s.hkv) * s.d;
    const std::vector<float> q = RandomQ(b.num_tokens() * q_stride, 3);
    const std::vector<float> qs = RandomQ(b.num_tokens() * q_stride, 4);
    std::vector<float> mass(b.num_seqs() * b.max_blocks_per_seq, 0.0f);
    std::vector<float> out(static_cast<size_t>(b.num_tokens()) * s.h * s.d);
    PagedAttention(
        {s.h, s.hkv, s.d, 1.0f / std::sqrt(static_cast<float>(s.d)), 0}, b,
        q.data(), qs.data(), q_stride, cache.View(), 0, out.data(),
        mass.data());
    for (int32_t sq = 0; sq < b.num_seqs(); ++sq) {
      std::vector<double> want(b.max_blocks_per_seq, 0.0);
      const int32_t n = b.seq_starts[sq + 1] - b.seq_starts[sq];
      if (b.WantsMass(sq)) {
        for (int32_t i = b.seq_starts[sq]; i < b.seq_starts[sq + 1]; ++i) {
          for (int h = 0; h < s.h; ++h) {
            const auto w =
                RefWeights(s, cache, sq, b.positions[i], h,
                           q.data() + i * q_stride + h * s.d,
                           qs.data() + i * q_stride + h * s.d, b.SinkLen(sq));
            for (size_t k = 0; k < w.size(); ++k) want[k / s.bs] += w[k];
          }
        }
      }
      double total = 0;
      for (int32_t blk = 0; blk < b.max_blocks_per_seq; ++blk) {
        const float got = mass[sq * b.max_blocks_per_seq + blk];
        total += got;
        // float32 sums of up to 360 rows' weights.
        EXPECT_NEAR(got, want[blk], 1e-5 * n * s.h + 1e-7)
            << "sequence " << sq << " block " << blk;
      }
      EXPECT_NEAR(total, b.WantsMass(sq) ? n * s.h : 0.0, 1e-4 * n * s.h);
    }
  }
}

// Where the queries sit changes no bit of a sequence's result (with int8,
// sequence 0 also scores 48 sink keys with a second query: q itself, so
// its tiles end at the sinks but its bits must not move either).
TEST(PagedAttentionInvariance, AloneChunkedThreadsAndBatchGiveTheSameBits) {
  const Shape s{9, 3, 64, 16, 0};
  const std::vector<Seq> seqs = {{600, 64}, {300, 1}, {45, 45}};
  for (KvDtype dtype : {KvDtype::kF16, KvDtype::kInt8}) {
    Cache cache(s, dtype, seqs, 11);
    const int64_t q_stride = static_cast<int64_t>(s.h + 2 * s.hkv) * s.d;
    const bool sinks = dtype == KvDtype::kInt8;
    auto batch = [&](const std::vector<Seq>& from, std::vector<size_t> ids) {
      ForwardBatch b = MakeBatch(cache, from, ids);
      if (sinks) {
        for (size_t id : ids) b.sink_lens.push_back(id == 0 ? 48 : 0);
      }
      return b;
    };
    auto run = [&](const ForwardBatch& b, const std::vector<float>& qq) {
      return RunKernel(s, b, qq, q_stride, cache.View(),
                       sinks ? qq.data() : nullptr);
    };
    const ForwardBatch all = batch(seqs, {0, 1, 2});
    const std::vector<float> q = RandomQ(all.num_tokens() * q_stride, 5);
    const std::vector<float> together = run(all, q);
    const int64_t row = static_cast<int64_t>(s.h) * s.d;

    // Sequence 0 alone.
    const ForwardBatch alone = batch(seqs, {0});
    const std::vector<float> q0(q.begin(), q.begin() + 64 * q_stride);
    const std::vector<float> solo = run(alone, q0);
    EXPECT_EQ(std::memcmp(solo.data(), together.data(), 64 * row * 4), 0);

    // Sequence 0's last 64 tokens as chunks of 13 and 51.
    std::vector<Seq> first = seqs, second = seqs;
    first[0] = {600 - 51, 13};
    second[0] = {600, 51};
    const ForwardBatch c1 = batch(first, {0});
    const ForwardBatch c2 = batch(second, {0});
    const std::vector<float> q1(q.begin(), q.begin() + 13 * q_stride);
    const std::vector<float> q2(q.begin() + 13 * q_stride,
                                q.begin() + 64 * q_stride);
    const std::vector<float> o1 = run(c1, q1);
    const std::vector<float> o2 = run(c2, q2);
    EXPECT_EQ(std::memcmp(o1.data(), together.data(), 13 * row * 4), 0);
    EXPECT_EQ(std::memcmp(o2.data(), together.data() + 13 * row, 51 * row * 4),
              0);

    // One thread.
    const int threads = NumThreads();
    SetNumThreads(1);
    const std::vector<float> one = run(all, q);
    SetNumThreads(threads);
    EXPECT_EQ(std::memcmp(one.data(), together.data(), together.size() * 4), 0);
  }
}

}  // namespace
}  // namespace kvserve::models
