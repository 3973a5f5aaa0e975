#include "models/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/parallel.h"
#include "kvcache/kv_sizing.h"
#include "models/cpu/kv_rows.h"
// Static dispatch only: the build targets its own CPU (-march=native).
#define HWY_COMPILE_ONLY_STATIC 1
#include "hwy/highway.h"
// The math header after highway.h, which it builds on.
#include "hwy/contrib/math/math-inl.h"

namespace kvserve::models {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using kvcache::KvDtype;
using DF = hn::ScalableTag<float>;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kGroup = kvcache::kKvQuantGroup;

// y[i] = y[i] * alpha + p * x[i] (alpha == 1: no rescale).
void ScaleAxpy(float alpha, float p, const float* x, float* y, int n) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  const auto va = hn::Set(d, alpha), vp = hn::Set(d, p);
  int i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto yv = hn::Mul(hn::LoadU(d, y + i), va);
    hn::StoreU(hn::MulAdd(vp, hn::LoadU(d, x + i), yv), d, y + i);
  }
  for (; i < n; ++i) y[i] = y[i] * alpha + p * x[i];
}

// Decodes one KV row of `dtype` into out[0, dd) in registers, lanes at a
// time (element order and values as DecodeKvRow).
void DecodeRow(KvDtype dtype, const std::byte* row, int dd, float* out) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(out, row, sizeof(float) * dd);
      return;
    case KvDtype::kF16: {
      const hn::Rebind<hwy::float16_t, DF> dh;
      const auto* src = reinterpret_cast<const hwy::float16_t*>(row);
      int i = 0;
      for (; i + lanes <= dd; i += lanes) {
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, src + i)), d, out + i);
      }
      for (; i < dd; ++i) out[i] = cpu::HalfToFloat(src[i].bits);
      return;
    }
    case KvDtype::kBF16: {
      const hn::Rebind<hwy::bfloat16_t, DF> db;
      const auto* src = reinterpret_cast<const hwy::bfloat16_t*>(row);
      int i = 0;
      for (; i + lanes <= dd; i += lanes) {
        hn::StoreU(hn::PromoteTo(d, hn::LoadU(db, src + i)), d, out + i);
      }
      for (; i < dd; ++i) out[i] = hwy::F32FromBF16(src[i]);
      return;
    }
    case KvDtype::kInt8: {
      // q8_0 blocks: fp16 scale, 32 int8. lanes <= 16 divides 32.
      const hn::Rebind<int8_t, DF> d8;
      const hn::RebindToSigned<DF> di;
      for (int g = 0; g < dd / kGroup; ++g) {
        const std::byte* b = row + g * (kGroup + 2);
        uint16_t h;
        std::memcpy(&h, b, 2);
        const auto scale = hn::Set(d, cpu::HalfToFloat(h));
        const auto* q = reinterpret_cast<const int8_t*>(b + 2);
        for (int j = 0; j < kGroup; j += lanes) {
          const auto v =
              hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, q + j)));
          hn::StoreU(hn::Mul(v, scale), d, out + g * kGroup + j);
        }
      }
      return;
    }
    case KvDtype::kInt4: {
      // q4_0 blocks: fp16 scale, 16 bytes; element j < 16 is the low nibble
      // of byte j, element 16 + j its high nibble.
      const hn::Rebind<uint8_t, DF> du8;
      const hn::RebindToSigned<DF> di;
      const auto mask = hn::Set(di, 0xf), eight = hn::Set(di, 8);
      for (int g = 0; g < dd / kGroup; ++g) {
        const std::byte* b = row + g * (kGroup / 2 + 2);
        uint16_t h;
        std::memcpy(&h, b, 2);
        const auto scale = hn::Set(d, cpu::HalfToFloat(h));
        const auto* qs = reinterpret_cast<const uint8_t*>(b + 2);
        for (int j = 0; j < kGroup / 2; j += lanes) {
          const auto bytes =
              hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(),
                                            hn::LoadU(du8, qs + j)));
          const auto lo = hn::Sub(hn::And(bytes, mask), eight);
          const auto hi = hn::Sub(hn::ShiftRight<4>(bytes), eight);
          float* o = out + g * kGroup + j;
          hn::StoreU(hn::Mul(hn::ConvertTo(d, lo), scale), d, o);
          hn::StoreU(hn::Mul(hn::ConvertTo(d, hi), scale), d, o + kGroup / 2);
        }
      }
      return;
    }
    case KvDtype::kFP8:
      break;
  }
  std::fill_n(out, dd, std::numeric_limits<float>::quiet_NaN());
}

// One query token of the batch: its sequence and the keys it may see.
struct QueryRef {
  int32_t seq;
  int32_t lo, pos;       // keys [lo, pos]
  int32_t first_split;   // lo / split_keys
  int64_t partial_base;  // first partial row of this token (x num_heads)
};

// A work item: tokens [tok_begin, tok_end) of one sequence, one KV head, one
// key split.
struct Item {
  int32_t seq, tok_begin, tok_end, kv_head, split;
};

struct Layout {
  const AttentionParams& p;
  const ForwardBatch& batch;
  const KvCacheView& kv;
  const std::byte* k_plane;
  const std::byte* v_plane;
  int32_t split_keys;
  int group;               // query heads per KV head
  int64_t row_bytes;       // bytes of one KV head's row
  int64_t partial_stride;  // floats per partial: m, l, acc[D]
};

// Per-thread scratch of one item.
struct Scratch {
  std::vector<float> q, k, kt, v, scores, m, l, acc;
};

// The decoded K page [nk][dd] transposed into chunks of `lanes` keys:
// kt[(c * dd + e) * lanes + j] = k[(c * lanes + j) * dd + e], zero padded.
void TransposeKeys(const float* k, int nk, int dd, int lanes, float* kt) {
  const int chunks = (nk + lanes - 1) / lanes;
  std::fill_n(kt, static_cast<int64_t>(chunks) * dd * lanes, 0.0f);
  for (int t = 0; t < nk; ++t) {
    float* col = kt + static_cast<int64_t>(t / lanes) * dd * lanes + t % lanes;
    const float* row = k + static_cast<int64_t>(t) * dd;
    for (int e = 0; e < dd; ++e) col[static_cast<int64_t>(e) * lanes] = row[e];
  }
}

// scores[r * stride + j] = q_r . k_j for the keys of the transposed page:
// each lane runs one key's dot product as an FMA chain over head_dim in
// order, so a score does not depend on its lane, row block or tile. Four
// rows at a time keep four chains in flight.
void ScoreTile(const float* q, int rows, int dd, const float* kt, int nk,
               float* scores, int64_t stride) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  const int chunks = (nk + lanes - 1) / lanes;
  for (int c = 0; c < chunks; ++c) {
    const float* ktc = kt + static_cast<int64_t>(c) * dd * lanes;
    float* out = scores + c * lanes;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      const float* q0 = q + static_cast<int64_t>(r) * dd;
      auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d),
           a3 = hn::Zero(d);
      for (int e = 0; e < dd; ++e) {
        const auto kv = hn::LoadU(d, ktc + static_cast<int64_t>(e) * lanes);
        a0 = hn::MulAdd(hn::Set(d, q0[e]), kv, a0);
        a1 = hn::MulAdd(hn::Set(d, q0[dd + e]), kv, a1);
        a2 = hn::MulAdd(hn::Set(d, q0[2 * dd + e]), kv, a2);
        a3 = hn::MulAdd(hn::Set(d, q0[3 * dd + e]), kv, a3);
      }
      hn::StoreU(a0, d, out + r * stride);
      hn::StoreU(a1, d, out + (r + 1) * stride);
      hn::StoreU(a2, d, out + (r + 2) * stride);
      hn::StoreU(a3, d, out + (r + 3) * stride);
    }
    for (; r < rows; ++r) {
      const float* qr = q + static_cast<int64_t>(r) * dd;
      auto a = hn::Zero(d);
      for (int e = 0; e < dd; ++e) {
        a = hn::MulAdd(hn::Set(d, qr[e]),
                       hn::LoadU(d, ktc + static_cast<int64_t>(e) * lanes), a);
      }
      hn::StoreU(a, d, out + r * stride);
    }
  }
}

const std::byte* KvRow(const Layout& L, const std::byte* plane, int32_t seq,
                       int32_t t, int kv_head) {
  const int32_t bs = L.kv.block_size;
  const int32_t block =
      L.batch
          .block_tables[static_cast<int64_t>(seq) * L.batch.max_blocks_per_seq +
                        t / bs];
  const int64_t slot = static_cast<int64_t>(block) * bs + t % bs;
  return plane + (slot * L.kv.num_kv_heads + kv_head) * L.row_bytes;
}

// Folds keys [k0, k1) (within one block; their scores in sc[0, k1 - k0))
// into row r's online softmax.
void FoldPage(const Layout& L, const QueryRef& ref, int32_t k0, int32_t k1,
              float* sc, Scratch& s, int r) {
  const int dd = L.p.head_dim;
  const int32_t lo = std::max(k0, ref.lo), hi = std::min(k1 - 1, ref.pos);
  if (lo > hi) return;  // nothing this row may see: as if not visited
  float page_max = kNegInf;
  for (int32_t t = lo; t <= hi; ++t) page_max = std::max(page_max, sc[t - k0]);
  const float m_old = s.m[r];
  const float m_new = std::max(m_old, page_max);
  const float alpha = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  const auto vm = hn::Set(d, m_new);
  int32_t t = lo;
  for (; t + lanes <= hi + 1; t += lanes) {
    float* x = sc + (t - k0);
    hn::StoreU(hn::Exp(d, hn::Sub(hn::LoadU(d, x), vm)), d, x);
  }
  if (t <= hi) {  // the tail through the same vector exp
    HWY_ALIGN float tail[HWY_MAX_BYTES / sizeof(float)];
    std::fill_n(tail, lanes, m_new);
    std::copy(sc + (t - k0), sc + (hi + 1 - k0), tail);
    hn::Store(hn::Exp(d, hn::Sub(hn::Load(d, tail), vm)), d, tail);
    std::copy_n(tail, hi + 1 - t, sc + (t - k0));
  }
  float* acc = s.acc.data() + static_cast<int64_t>(r) * dd;
  float l = s.l[r] * alpha;
  float a = alpha;
  for (t = lo; t <= hi; ++t) {
    const float pt = sc[t - k0];
    l += pt;
    ScaleAxpy(a, pt, s.v.data() + static_cast<int64_t>(t - k0) * dd, acc, dd);
    a = 1.0f;
  }
  s.l[r] = l;
  s.m[r] = m_new;
}

// Runs one item: fills the partials of its tokens' query heads for its
// split.
void RunItem(const Layout& L, const std::vector<QueryRef>& refs, const Item& it,
             const float* q, int64_t q_stride, float* partials, Scratch& s) {
  const int dd = L.p.head_dim, g = L.group;
  const int32_t bs = L.kv.block_size;
  const int rows = (it.tok_end - it.tok_begin) * g;
  const int32_t split_lo = it.split * L.split_keys;
  int32_t key_lo = std::numeric_limits<int32_t>::max(), key_hi = -1;
  for (int32_t i = it.tok_begin; i < it.tok_end; ++i) {
    key_lo = std::min(key_lo, refs[i].lo);
    key_hi = std::max(key_hi, refs[i].pos);
  }
  key_lo = std::max(key_lo, split_lo);
  key_hi = std::min(key_hi, split_lo + L.split_keys - 1);
  if (key_lo > key_hi) return;

  s.q.resize(static_cast<size_t>(rows) * dd);
  s.acc.assign(static_cast<size_t>(rows) * dd, 0.0f);
  s.m.assign(rows, kNegInf);
  s.l.assign(rows, 0.0f);
  const int lanes = static_cast<int>(hn::Lanes(DF()));
  const int64_t score_stride = (bs + lanes - 1) / lanes * lanes;
  s.k.resize(static_cast<size_t>(bs) * dd);
  s.kt.resize(static_cast<size_t>(score_stride) * dd);
  s.v.resize(static_cast<size_t>(bs) * dd);
  s.scores.resize(static_cast<size_t>(rows) * score_stride + lanes);
  for (int32_t i = it.tok_begin; i < it.tok_end; ++i) {
    for (int j = 0; j < g; ++j) {
      const float* src = q + i * q_stride + (it.kv_head * g + j) * dd;
      float* dst = s.q.data() + ((i - it.tok_begin) * g + j) * dd;
      for (int e = 0; e < dd; ++e) dst[e] = src[e] * L.p.scale;
    }
  }
  for (int32_t b0 = key_lo / bs * bs; b0 <= key_hi; b0 += bs) {
    const int32_t k0 = std::max(b0, key_lo);
    const int32_t k1 = std::min(b0 + bs, key_hi + 1);
    for (int32_t t = k0; t < k1; ++t) {
      const int64_t off = static_cast<int64_t>(t - k0) * dd;
      DecodeRow(L.kv.dtype, KvRow(L, L.k_plane, it.seq, t, it.kv_head), dd,
                s.k.data() + off);
      DecodeRow(L.kv.dtype, KvRow(L, L.v_plane, it.seq, t, it.kv_head), dd,
                s.v.data() + off);
    }
    TransposeKeys(s.k.data(), k1 - k0, dd, lanes, s.kt.data());
    ScoreTile(s.q.data(), rows, dd, s.kt.data(), k1 - k0, s.scores.data(),
              score_stride);
    for (int r = 0; r < rows; ++r) {
      const QueryRef& ref = refs[it.tok_begin + r / g];
      FoldPage(L, ref, k0, k1, s.scores.data() + r * score_stride, s, r);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int32_t i = it.tok_begin + r / g;
    const QueryRef& ref = refs[i];
    if (it.split < ref.first_split || it.split > ref.pos / L.split_keys) {
      continue;
    }
    const int h = it.kv_head * g + r % g;
    float* dst =
        partials +
        ((ref.partial_base + it.split - ref.first_split) * L.p.num_heads + h) *
            L.partial_stride;
    dst[0] = s.m[r];
    dst[1] = s.l[r];
    std::memcpy(dst + 2, s.acc.data() + static_cast<int64_t>(r) * dd,
                sizeof(float) * dd);
  }
}

// out row i, head h: the splits' partials merged in split order.
void Combine(const Layout& L, const QueryRef& ref, const float* partials,
             float* out_row) {
  const int dd = L.p.head_dim;
  const int32_t nsplit = ref.pos / L.split_keys - ref.first_split + 1;
  for (int h = 0; h < L.p.num_heads; ++h) {
    const float* part0 =
        partials + (ref.partial_base * L.p.num_heads + h) * L.partial_stride;
    auto at = [&](int32_t j) {
      return part0 + static_cast<int64_t>(j) * L.p.num_heads * L.partial_stride;
    };
    float mx = kNegInf;
    for (int32_t j = 0; j < nsplit; ++j) mx = std::max(mx, at(j)[0]);
    float* o = out_row + h * dd;
    std::fill_n(o, dd, 0.0f);
    float l = 0.0f;
    for (int32_t j = 0; j < nsplit; ++j) {
      const float* pj = at(j);
      if (pj[0] == kNegInf) continue;
      const float w = std::exp(pj[0] - mx);
      l += pj[1] * w;
      ScaleAxpy(1.0f, w, pj + 2, o, dd);
    }
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int e = 0; e < dd; ++e) o[e] *= inv;
  }
}

}  // namespace

void PagedAttention(const AttentionParams& p, const ForwardBatch& batch,
                    const float* q, int64_t q_stride, const KvCacheView& kv,
                    int layer, float* out) {
  const int32_t bs = kv.block_size;
  const int32_t split_keys = (kAttnSplitKeys + bs - 1) / bs * bs;
  const Layout L{p,
                 batch,
                 kv,
                 kv.k[layer],
                 kv.v[layer],
                 split_keys,
                 p.num_heads / p.num_kv_heads,
                 kv.RowBytes(),
                 2 + p.head_dim};
  const int32_t num_tokens = batch.num_tokens();
  std::vector<QueryRef> refs(num_tokens);
  std::vector<Item> items;
  int64_t partial_rows = 0;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t begin = batch.seq_starts[s], end = batch.seq_starts[s + 1];
    for (int32_t i = begin; i < end; ++i) {
      const int32_t pos = batch.positions[i];
      const int32_t lo =
          p.sliding_window > 0 ? std::max(0, pos - p.sliding_window + 1) : 0;
      refs[i] = {s, lo, pos, lo / split_keys, partial_rows};
      partial_rows += pos / split_keys - lo / split_keys + 1;
    }
    for (int32_t tb = begin; tb < end; tb += kAttnQueryTile) {
      const int32_t te = std::min(end, tb + kAttnQueryTile);
      int32_t first = std::numeric_limits<int32_t>::max(), last = 0;
      for (int32_t i = tb; i < te; ++i) {
        first = std::min(first, refs[i].first_split);
        last = std::max(last, refs[i].pos / split_keys);
      }
      for (int h = 0; h < p.num_kv_heads; ++h) {
        for (int32_t j = first; j <= last; ++j)
          items.push_back({s, tb, te, h, j});
      }
    }
  }
  // The calling thread's buffer, reused across calls; workers get its
  // address (a thread_local named inside the lambdas would be their own).
  thread_local std::vector<float> partial_buf;
  partial_buf.resize(static_cast<size_t>(partial_rows) * p.num_heads *
                     L.partial_stride);
  float* const partials = partial_buf.data();
  ParallelForEach(static_cast<int64_t>(items.size()), [&](int64_t n) {
    thread_local Scratch scratch;
    RunItem(L, refs, items[n], q, q_stride, partials, scratch);
  });
  const int64_t out_stride = static_cast<int64_t>(p.num_heads) * p.head_dim;
  ParallelFor(num_tokens, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      Combine(L, refs[i], partials, out + i * out_stride);
    }
  });
}

}  // namespace kvserve::models
