#include "models/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/parallel.h"
#include "kvcache/kv_sizing.h"
// Static dispatch only: the build targets its own CPU (-march=native).
#define HWY_COMPILE_ONLY_STATIC 1
#include "hwy/highway.h"
// After highway.h, which they build on.
#include "hwy/contrib/math/math-inl.h"
#include "models/cpu/kv_tile_rows-inl.h"
// After kv_tile_rows-inl.h, whose row sources it reads.
#include "models/cpu/attn_rows-inl.h"
#include "models/cpu/tile_prefetcher.h"

namespace kvserve::models {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using cpu_attn::AccumOp;
using cpu_attn::CacheRows;
using cpu_attn::DecodeTile;
using cpu_attn::DF;
using cpu_attn::ForRowsNc;
using cpu_attn::Int4Rows;
using cpu_attn::Int8Rows;
using cpu_attn::kGroup;
using cpu_attn::ScoreOp;
using cpu_attn::TilePrefetcher;
using cpu_attn::TileRows;
using kvcache::KvDtype;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

// One query token of the batch: its sequence and the keys it may see.
struct QueryRef {
  int32_t seq;
  int32_t lo, pos;       // keys [lo, pos]
  int32_t first_split;   // lo / split_keys
  int64_t partial_base;  // first partial row of this token (x num_heads)
};

// A work item: tokens [tok_begin, tok_end) of one sequence, KV heads
// [kv_head_begin, kv_head_end), one key split. Its rows are head-major:
// row (h - kv_head_begin) * tokens * group + token * group + j.
struct Item {
  int32_t seq, tok_begin, tok_end, kv_head_begin, kv_head_end, split;
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
  // Attention mass per block (null: nobody asked): [S * max_blocks_per_seq].
  float* block_mass;
  int32_t mass_blocks;              // blocks one split's keys can touch
  const cpu::KvResidual* residual;  // int3/int2: rows read in full precision
  int layer;
};

// The keys of a tile row r may see, as [lo, hi) relative to the tile's
// first position (lo >= hi: none).
struct RowRange {
  int lo, hi;
};

// Per-thread scratch of one item. Tiles are padded to `dp` floats a row
// (head_dim rounded up to the vector width) with zero tails.
struct Scratch {
  std::vector<float> q, q_sink, k, v, scores, m, l, acc;
  // Mass tracking only: each row's weight per block of the split (relative
  // to its running max, like acc) and the running max before the tile.
  std::vector<float> mass, m_before;
  std::vector<int64_t> row_offsets;  // of this and the next tile's rows
  std::vector<RowRange> ranges;
  TilePrefetcher pf;
};

// Keys per KV tile: an item folds its split this many positions at a
// time (tiles start at the split's first position), amortizing the
// softmax rescale and the accumulator loads over several blocks. The
// prefetcher runs one tile ahead, so the tile also sets how far ahead it
// reads: 48 KB of K and V for 64 fp16 keys of 3 KV heads. At 128 keys
// (96 KB, twice an L1) the lines were evicted before they were read and a
// decode from memory took ~20% longer; 32 keys read no faster and cost the
// prefill more rescales (tools/bench/cpu_attention_bench.cc).
constexpr int kTileKeys = 64;
static_assert(kAttnSplitKeys % kTileKeys == 0, "tiles never cross a split");

// Byte offsets, within a layer's K (or V) plane, of the slots (KV head 0's
// rows) at positions [t0, t0 + n) of sequence `seq`.
void TileRowOffsets(const Layout& L, int32_t seq, int32_t t0, int n,
                    int64_t* out) {
  const int32_t bs = L.kv.block_size;
  const int32_t* table = L.batch.block_tables.data() +
                         static_cast<int64_t>(seq) * L.batch.max_blocks_per_seq;
  const int64_t slot_bytes = L.kv.num_kv_heads * L.row_bytes;
  for (int t = 0; t < n;) {
    const int32_t pos = t0 + t, off = pos % bs;
    const int len = std::min(n - t, bs - off);
    int64_t o = (static_cast<int64_t>(table[pos / bs]) * bs + off) * slot_bytes;
    for (int j = 0; j < len; ++j, o += slot_bytes) out[t + j] = o;
    t += len;
  }
}

// Row r's online softmax over its visible keys of the page: exponentiates
// its scores in place (relative to the new running max; keys it may not
// see become 0), adds them to l and rescales its accumulator by
// exp(m_old - m_new). `sc` spans whole vectors (sc_stride floats). Lane j
// of vector c is the page's key c * lanes + j, so the sum of a page is the
// same tree of the same positions however the batch was tiled.
void SoftmaxPage(float* sc, int64_t sc_stride, RowRange rr, int dp, Scratch& s,
                 int r) {
  const DF d;
  const int lanes = static_cast<int>(hn::Lanes(d));
  const hn::RebindToSigned<DF> di;
  const auto iota = hn::Iota(di, 0);
  const auto lo = hn::Set(di, rr.lo), hi = hn::Set(di, rr.hi);
  // Every key of the tile visible (a decode's full tiles): no masks, the
  // same values.
  const bool all = rr.lo == 0 && rr.hi == sc_stride;
  auto visible = [&](int c) {
    const auto pos = hn::Add(iota, hn::Set(di, c));
    return hn::RebindMask(d, hn::AndNot(hn::Lt(pos, lo), hn::Lt(pos, hi)));
  };
  auto vmax = hn::Set(d, kNegInf);
  for (int c = rr.lo / lanes * lanes; c < rr.hi; c += lanes) {
    const auto x = hn::LoadU(d, sc + c);
    vmax = hn::Max(vmax, all ? x : hn::IfThenElse(visible(c), x, vmax));
  }
  const float m_old = s.m[r];
  const float m_new = std::max(m_old, hn::GetLane(hn::MaxOfLanes(d, vmax)));
  const auto vm = hn::Set(d, m_new);
  auto vsum = hn::Zero(d);
  for (int c = 0; c < sc_stride; c += lanes) {
    if (all) {
      const auto p = hn::Exp(d, hn::Sub(hn::LoadU(d, sc + c), vm));
      vsum = hn::Add(vsum, p);
      hn::StoreU(p, d, sc + c);
      continue;
    }
    const auto mask = visible(c);
    const auto x = hn::IfThenElse(mask, hn::LoadU(d, sc + c), vm);
    const auto p = hn::IfThenElseZero(mask, hn::Exp(d, hn::Sub(x, vm)));
    vsum = hn::Add(vsum, p);
    hn::StoreU(p, d, sc + c);
  }
  const float sum = hn::GetLane(hn::SumOfLanes(d, vsum));
  s.m[r] = m_new;
  // The running max unchanged: alpha would be exp(0) = 1. Before the
  // row's first visible key, l and the accumulator are 0.
  if (m_new == m_old || m_old == kNegInf) {
    s.l[r] += sum;
    return;
  }
  const float alpha = std::exp(m_old - m_new);
  s.l[r] = s.l[r] * alpha + sum;
  float* acc = s.acc.data() + static_cast<int64_t>(r) * dp;
  const auto va = hn::Set(d, alpha);
  for (int c = 0; c < dp; c += lanes) {
    hn::StoreU(hn::Mul(hn::LoadU(d, acc + c), va), d, acc + c);
  }
}

// Adds the page's weighted V rows to rows [r0, r0 + n): the keys all of
// them see together as one block, the rest of each row's range (before and
// after, in key order) row by row.
template <typename Src>
void AccumBlock(const float* sc, int64_t sc_stride, const RowRange* rr, int r0,
                int n, const Src& v, int dp, int nc, float* acc_base,
                TilePrefetcher* pf) {
  int ilo = 0, ihi = std::numeric_limits<int>::max();
  for (int i = 0; i < n; ++i) {
    ilo = std::max(ilo, rr[r0 + i].lo);
    ihi = std::min(ihi, rr[r0 + i].hi);
  }
  if (ilo >= ihi) ilo = ihi = rr[r0].hi;  // no common keys: all row by row
  auto one_row = [&](int r, int t0, int t1) {
    if (t0 < t1) {
      ForRowsNc<AccumOp>(1, nc, sc + r * sc_stride, sc_stride, v, dp, nc, t0,
                         t1, acc_base + static_cast<int64_t>(r) * dp, pf);
    }
  };
  for (int i = 0; i < n; ++i) {
    one_row(r0 + i, rr[r0 + i].lo, std::min(rr[r0 + i].hi, ilo));
  }
  if (ilo < ihi) {
    ForRowsNc<AccumOp>(n, nc, sc + r0 * sc_stride, sc_stride, v, dp, nc, ilo,
                       ihi, acc_base + static_cast<int64_t>(r0) * dp, pf);
  }
  for (int i = 0; i < n; ++i) {
    one_row(r0 + i, std::max(rr[r0 + i].lo, ihi), rr[r0 + i].hi);
  }
}

// Rows scored together: as many as keep their query vectors and the
// accumulators in registers (a decode group at once; pairs for a prefill
// tile, which then fill all accumulators).
int ScoreBlockRows(int rows, int nc) {
  const int max_rows = nc <= 2 ? 4 : nc <= 4 ? 3 : 1;
  if (rows <= max_rows) return rows;
  return nc <= 2 ? 4 : std::min(max_rows, 2);
}

// One page of an item, its K and V rows read through `k` and `v`: scores
// of every row, each row's online softmax over the keys it may see, and
// the weighted V rows added in key order.
template <typename Src>
void FoldPage(const Src& k, const Src& v, int n, int rows, int row0, int dp,
              int nc, int64_t sc_stride, const RowRange* rr, Scratch& s) {
  float* sc = s.scores.data() + row0 * sc_stride;
  const float* q = s.q.data() + static_cast<int64_t>(row0) * dp;
  const int rb = ScoreBlockRows(rows, nc);
  for (int r0 = 0; r0 < rows; r0 += rb) {
    ForRowsNc<ScoreOp>(std::min(rb, rows - r0), nc, q + r0 * dp, dp, nc, k, n,
                       sc + r0 * sc_stride, sc_stride, &s.pf);
  }
  for (int r = 0; r < rows; ++r) {
    if (rr[r].lo < rr[r].hi) {
      SoftmaxPage(sc + r * sc_stride, sc_stride, rr[r], dp, s, row0 + r);
    }
  }
  for (int r0 = 0; r0 < rows; r0 += 4) {
    AccumBlock(sc, sc_stride, rr, r0, std::min(4, rows - r0), v, dp, nc,
               s.acc.data() + static_cast<int64_t>(row0) * dp, &s.pf);
  }
}

// The item's query rows of `q`, pre-scaled, into `dst` (rows of dp floats).
void LoadQueryRows(const Layout& L, const Item& it, const float* q,
                   int64_t q_stride, int rows, int dp,
                   std::vector<float>& dst_rows) {
  const int dd = L.p.head_dim, g = L.group;
  dst_rows.assign(static_cast<size_t>(rows) * dp, 0.0f);
  float* dst = dst_rows.data();
  for (int h = it.kv_head_begin; h < it.kv_head_end; ++h) {
    for (int32_t i = it.tok_begin; i < it.tok_end; ++i) {
      for (int j = 0; j < g; ++j, dst += dp) {
        const float* src = q + i * q_stride + (h * g + j) * dd;
        for (int e = 0; e < dd; ++e) dst[e] = src[e] * L.p.scale;
      }
    }
  }
}

// Sizes the item's scratch and loads its query rows.
void PrepareItem(const Layout& L, const Item& it, const float* q,
                 int64_t q_stride, int rows, int dp, int64_t sc_stride,
                 Scratch& s) {
  const int dd = L.p.head_dim;
  const int32_t bs = kTileKeys;
  s.row_offsets.resize(2 * kTileKeys);
  LoadQueryRows(L, it, q, q_stride, rows, dp, s.q);
  s.acc.assign(static_cast<size_t>(rows) * dp, 0.0f);
  s.m.assign(rows, kNegInf);
  s.l.assign(rows, 0.0f);
  if (dp != dd) {  // zero tails; decoding writes only [0, dd) of a row
    s.k.assign(static_cast<size_t>(bs) * dp, 0.0f);
    s.v.assign(static_cast<size_t>(bs) * dp, 0.0f);
  } else {
    s.k.resize(static_cast<size_t>(bs) * dp);
    s.v.resize(static_cast<size_t>(bs) * dp);
  }
  s.scores.resize(static_cast<size_t>(rows) * sc_stride);
}

// Folds keys [t0, t0 + n) into the item's rows (rr: each row's visible
// keys relative to t0), reading the float dtypes in place when the rows
// are few, otherwise decoding the tile once.
void FoldTile(const Layout& L, const Item& it, const int64_t* rows_at,
              int32_t t0, int n, int rows, int dp, int nc, const RowRange* rr,
              Scratch& s) {
  const int dd = L.p.head_dim;
  // Quantized groups hold whole vectors when lanes divide half a group.
  const bool direct =
      rows <= 4 && dd == dp && (kGroup / 2) % hn::Lanes(DF()) == 0;
  const int64_t tk = kTileKeys;
  for (int h = it.kv_head_begin; h < it.kv_head_end; ++h) {
    const std::byte* kp = L.k_plane + h * L.row_bytes;
    const std::byte* vp = L.v_plane + h * L.row_bytes;
    const int row0 = (h - it.kv_head_begin) * rows;
    // Low-bit rows always decode into a tile (they need their positions).
    const bool low_bit = kvcache::KvLowBits(L.kv.dtype) > 0;
    switch (direct || low_bit ? L.kv.dtype : KvDtype::kFP8) {
      case KvDtype::kInt8:
        FoldPage(Int8Rows{kp, rows_at}, Int8Rows{vp, rows_at}, n, rows, row0,
                 dp, nc, tk, rr, s);
        break;
      case KvDtype::kInt4:
        FoldPage(Int4Rows{kp, rows_at}, Int4Rows{vp, rows_at}, n, rows, row0,
                 dp, nc, tk, rr, s);
        break;
      case KvDtype::kF16:
        FoldPage(CacheRows<hwy::float16_t>{kp, rows_at},
                 CacheRows<hwy::float16_t>{vp, rows_at}, n, rows, row0, dp, nc,
                 tk, rr, s);
        break;
      case KvDtype::kBF16:
        FoldPage(CacheRows<hwy::bfloat16_t>{kp, rows_at},
                 CacheRows<hwy::bfloat16_t>{vp, rows_at}, n, rows, row0, dp, nc,
                 tk, rr, s);
        break;
      case KvDtype::kF32:
        FoldPage(CacheRows<float>{kp, rows_at}, CacheRows<float>{vp, rows_at},
                 n, rows, row0, dp, nc, tk, rr, s);
        break;
      case KvDtype::kInt3:
      case KvDtype::kInt2: {
        const int64_t slot = L.kv.num_kv_heads * L.row_bytes;
        cpu_attn::DecodeLowBitTile(L.kv.dtype, true, kp, rows_at, t0, n, dd, dp,
                                   slot, s.k.data());
        cpu_attn::DecodeLowBitTile(L.kv.dtype, false, vp, rows_at, t0, n, dd,
                                   dp, slot, s.v.data());
        if (L.residual != nullptr) {
          const int32_t first = L.batch.positions[L.batch.seq_starts[it.seq]];
          cpu_attn::OverlayResidualRows(
              *L.residual, L.layer, rows_at,
              first - first % kvcache::kKvKeyGroupTokens - t0, n, slot, h, dd,
              L.kv.num_kv_heads * dd, dp, s.k.data(), s.v.data());
        }
        FoldPage(TileRows{s.k.data(), dp}, TileRows{s.v.data(), dp}, n, rows,
                 row0, dp, nc, tk, rr, s);
        break;
      }
      default:
        DecodeTile(L.kv.dtype, kp, rows_at, n, dd, dp, s.k.data());
        DecodeTile(L.kv.dtype, vp, rows_at, n, dd, dp, s.v.data());
        FoldPage(TileRows{s.k.data(), dp}, TileRows{s.v.data(), dp}, n, rows,
                 row0, dp, nc, tk, rr, s);
    }
  }
}

// Adds the tile [t0, t0 + n)'s softmax weights (in s.scores, relative to
// each row's new running max) to the rows' per-block sums, first rescaled
// by exp(m_old - m_new) as the accumulators were. Rows of all `heads` KV
// heads; rr per row of one head.
void AddTileMass(const Layout& L, int32_t split_lo, int32_t t0, int n, int rows,
                 int heads, const RowRange* rr, Scratch& s) {
  const int32_t bs = L.kv.block_size, b0 = split_lo / bs;
  for (int h = 0; h < heads; ++h) {
    for (int r = 0; r < rows; ++r) {
      if (rr[r].lo >= rr[r].hi) continue;  // scores left unexponentiated
      const int row = h * rows + r;
      float* bm = s.mass.data() + static_cast<int64_t>(row) * L.mass_blocks;
      const float m_old = s.m_before[row], m_new = s.m[row];
      if (m_old != m_new && m_old != kNegInf) {
        const float alpha = std::exp(m_old - m_new);
        for (int b = 0; b < L.mass_blocks; ++b) bm[b] *= alpha;
      }
      const float* p = s.scores.data() + static_cast<int64_t>(row) * kTileKeys;
      for (int k = rr[r].lo; k < std::min(rr[r].hi, n); ++k) {
        bm[(t0 + k) / bs - b0] += p[k];
      }
    }
  }
}

// Writes the item's (max, sum, accumulator) rows into the partials of its
// tokens that see its split.
void WritePartials(const Layout& L, const std::vector<QueryRef>& refs,
                   const Item& it, int rows, int dp, const Scratch& s,
                   float* partials, float* partial_mass) {
  const int dd = L.p.head_dim, g = L.group;
  const int per_head = (it.tok_end - it.tok_begin) * g;
  for (int r = 0; r < rows; ++r) {
    const int kv_head = it.kv_head_begin + r / per_head, w = r % per_head;
    const QueryRef& ref = refs[it.tok_begin + w / g];
    if (it.split < ref.first_split || it.split > ref.pos / L.split_keys) {
      continue;
    }
    const int h = kv_head * g + w % g;
    const int64_t at =
        (ref.partial_base + it.split - ref.first_split) * L.p.num_heads + h;
    float* dst = partials + at * L.partial_stride;
    dst[0] = s.m[r];
    dst[1] = s.l[r];
    std::memcpy(dst + 2, s.acc.data() + static_cast<int64_t>(r) * dp,
                sizeof(float) * dd);
    if (partial_mass != nullptr) {
      std::memcpy(partial_mass + at * L.mass_blocks,
                  s.mass.data() + static_cast<int64_t>(r) * L.mass_blocks,
                  sizeof(float) * L.mass_blocks);
    }
  }
}

// Runs one item: fills the partials of its tokens' query heads for its
// split, kTileKeys positions at a time from the split's start. A tile
// covers its positions up to the last key any row sees (earlier keys of
// the tile are scored and masked), so a key's lane is its position in the
// tile whatever the rows are. Tiles also end at the sequence's sink length,
// so that each is scored by one query (q_sink before it, q after): a
// property of the sequence, not of the batch.
void RunItem(const Layout& L, const std::vector<QueryRef>& refs, const Item& it,
             const float* q, const float* q_sink, int64_t q_stride,
             float* partials, float* partial_mass, Scratch& s) {
  const int dd = L.p.head_dim, g = L.group;
  const int rows = (it.tok_end - it.tok_begin) * g;  // per KV head
  const int all_rows = rows * (it.kv_head_end - it.kv_head_begin);
  const int32_t split_lo = it.split * L.split_keys;
  int32_t key_lo = std::numeric_limits<int32_t>::max(), key_hi = -1;
  for (int32_t i = it.tok_begin; i < it.tok_end; ++i) {
    key_lo = std::min(key_lo, refs[i].lo);
    key_hi = std::max(key_hi, refs[i].pos);
  }
  key_lo = std::max(key_lo, split_lo);
  key_hi = std::min(key_hi, split_lo + L.split_keys - 1);
  if (key_lo > key_hi) return;

  const int lanes = static_cast<int>(hn::Lanes(DF()));
  const int nc = (dd + lanes - 1) / lanes, dp = nc * lanes;
  PrepareItem(L, it, q, q_stride, all_rows, dp, kTileKeys, s);
  const int32_t sink_end = q_sink != nullptr ? L.batch.SinkLen(it.seq) : 0;
  if (key_lo < sink_end) {
    LoadQueryRows(L, it, q_sink, q_stride, all_rows, dp, s.q_sink);
  }
  const bool mass = partial_mass != nullptr && L.batch.WantsMass(it.seq);
  if (mass) {
    s.mass.assign(static_cast<size_t>(all_rows) * L.mass_blocks, 0.0f);
  }
  std::vector<RowRange>& rr = s.ranges;
  rr.resize(rows);
  const int32_t first = split_lo + (key_lo - split_lo) / kTileKeys * kTileKeys;
  auto tile_end = [&](int32_t t0) {
    const int32_t end = std::min(t0 + kTileKeys, key_hi + 1);
    return t0 < sink_end ? std::min(end, sink_end) : end;
  };
  int64_t* cur = s.row_offsets.data();
  int64_t* next = cur + kTileKeys;
  TileRowOffsets(L, it.seq, first, tile_end(first) - first, cur);
  // Nothing requested the first tile's lines earlier: all of them now.
  s.pf.Reset(L.k_plane, L.v_plane, cur, tile_end(first) - first,
             it.kv_head_begin * L.row_bytes, it.kv_head_end * L.row_bytes, 1);
  s.pf.Finish();
  for (int32_t t0 = first, k1 = 0; t0 <= key_hi; t0 = k1) {
    k1 = tile_end(t0);
    // The pages are scattered, so the hardware prefetcher cannot find the
    // next tile; ask for it while this one is folded (about one accumulate
    // step per key and KV head).
    int next_n = 0;
    if (k1 <= key_hi) {
      next_n = tile_end(k1) - k1;
      TileRowOffsets(L, it.seq, k1, next_n, next);
    }
    s.pf.Reset(L.k_plane, L.v_plane, next, next_n,
               it.kv_head_begin * L.row_bytes, it.kv_head_end * L.row_bytes,
               int64_t{k1 - t0} * (it.kv_head_end - it.kv_head_begin));
    for (int r = 0; r < rows; ++r) {
      const QueryRef& ref = refs[it.tok_begin + r / g];
      rr[r] = {std::max(t0, ref.lo) - t0, std::min(k1 - 1, ref.pos) + 1 - t0};
    }
    const bool sink_tile = t0 < sink_end;
    if (sink_tile) std::swap(s.q, s.q_sink);
    if (mass) s.m_before.assign(s.m.begin(), s.m.end());
    FoldTile(L, it, cur, t0, k1 - t0, rows, dp, nc, rr.data(), s);
    if (mass) {
      AddTileMass(L, split_lo, t0, k1 - t0, rows,
                  it.kv_head_end - it.kv_head_begin, rr.data(), s);
    }
    if (sink_tile) std::swap(s.q, s.q_sink);
    s.pf.Finish();
    std::swap(cur, next);
  }
  WritePartials(L, refs, it, all_rows, dp, s, partials,
                mass ? partial_mass : nullptr);
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

// Adds token `ref`'s attention weights per block, over its query heads, to
// its sequence's row of L.block_mass: each split's block sums scaled by
// the split's share of the row's softmax, exp(m_j - max) / l.
void AddBlockMass(const Layout& L, const QueryRef& ref, const float* partials,
                  const float* partial_mass) {
  const int32_t nsplit = ref.pos / L.split_keys - ref.first_split + 1;
  const int32_t bs = L.kv.block_size, nb = L.batch.max_blocks_per_seq;
  float* out = L.block_mass + static_cast<int64_t>(ref.seq) * nb;
  for (int h = 0; h < L.p.num_heads; ++h) {
    auto at = [&](int32_t j) {
      return (ref.partial_base + j) * L.p.num_heads + h;
    };
    float mx = kNegInf, l = 0.0f;
    for (int32_t j = 0; j < nsplit; ++j) {
      mx = std::max(mx, partials[at(j) * L.partial_stride]);
    }
    for (int32_t j = 0; j < nsplit; ++j) {
      const float* pj = partials + at(j) * L.partial_stride;
      if (pj[0] != kNegInf) l += pj[1] * std::exp(pj[0] - mx);
    }
    if (!(l > 0.0f)) continue;
    for (int32_t j = 0; j < nsplit; ++j) {
      const float m = partials[at(j) * L.partial_stride];
      if (m == kNegInf) continue;
      const float w = std::exp(m - mx) / l;
      const float* bm = partial_mass + at(j) * L.mass_blocks;
      const int32_t b0 = (ref.first_split + j) * L.split_keys / bs;
      for (int32_t b = 0; b < L.mass_blocks && b0 + b < nb; ++b) {
        out[b0 + b] += w * bm[b];
      }
    }
  }
}

// All KV heads in one item, so that a thread reads each slot's rows
// together (contiguous in the page), unless that leaves fewer than two
// items per thread; then one head per item. Only the work split depends on
// this, never a result.
int HeadsPerItem(const AttentionParams& p, const ForwardBatch& batch,
                 int32_t split_keys) {
  int64_t items = 0;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t begin = batch.seq_starts[s], end = batch.seq_starts[s + 1];
    for (int32_t tb = begin; tb < end; tb += kAttnQueryTile) {
      const int32_t te = std::min(end, tb + kAttnQueryTile);
      items += batch.positions[te - 1] / split_keys + 1;
    }
  }
  return items >= 2 * NumThreads() ? p.num_kv_heads : 1;
}

}  // namespace

void PagedAttention(const AttentionParams& p, const ForwardBatch& batch,
                    const float* q, const float* q_sink, int64_t q_stride,
                    const KvCacheView& kv, int layer, float* out,
                    float* block_mass, const cpu::KvResidual* residual) {
  const int32_t split_keys = kAttnSplitKeys;
  const bool mass = block_mass != nullptr && !batch.mass_seqs.empty();
  const Layout L{p,
                 batch,
                 kv,
                 kv.k[layer],
                 kv.v[layer],
                 split_keys,
                 p.num_heads / p.num_kv_heads,
                 kv.RowBytes(),
                 2 + p.head_dim,
                 block_mass,
                 split_keys / kv.block_size + 2,
                 residual,
                 layer};
  const int32_t num_tokens = batch.num_tokens();
  std::vector<QueryRef> refs(num_tokens);
  std::vector<Item> items;
  const int heads_per_item = HeadsPerItem(p, batch, split_keys);
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
      for (int h = 0; h < p.num_kv_heads; h += heads_per_item) {
        const int he = std::min(p.num_kv_heads, h + heads_per_item);
        for (int32_t j = first; j <= last; ++j) {
          items.push_back({s, tb, te, h, he, j});
        }
      }
    }
  }
  // The calling thread's buffer, reused across calls; workers get its
  // address (a thread_local named inside the lambdas would be their own).
  thread_local std::vector<float> partial_buf;
  partial_buf.resize(static_cast<size_t>(partial_rows) * p.num_heads *
                     L.partial_stride);
  float* const partials = partial_buf.data();
  thread_local std::vector<float> mass_buf;
  if (mass) {
    mass_buf.resize(static_cast<size_t>(partial_rows) * p.num_heads *
                    L.mass_blocks);
  }
  float* const partial_mass = mass ? mass_buf.data() : nullptr;
  ParallelForEach(static_cast<int64_t>(items.size()), [&](int64_t n) {
    thread_local Scratch scratch;
    RunItem(L, refs, items[n], q, q_sink, q_stride, partials, partial_mass,
            scratch);
  });
  const int64_t out_stride = static_cast<int64_t>(p.num_heads) * p.head_dim;
  ParallelFor(num_tokens, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      Combine(L, refs[i], partials, out + i * out_stride);
    }
  });
  if (!mass) return;
  for (int32_t i = 0; i < num_tokens; ++i) {  // in order: sums per sequence
    if (batch.WantsMass(refs[i].seq)) {
      AddBlockMass(L, refs[i], partials, partial_mass);
    }
  }
}

}  // namespace kvserve::models
