#include "models/cpu/onednn_matmul.h"

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/parallel.h"
#include "models/cpu/aligned_buffer.h"
#include "models/cpu/float_kernels.h"

namespace kvserve::models::cpu::internal {
namespace {

// Rows per primitive call, and the granularity m is padded to: at most
// kChunkRows / kPadRows primitives per weight shape.
constexpr int64_t kChunkRows = 512;
constexpr int64_t kPadRows = 16;
// m used to let oneDNN pick the weight layout at pack time.
constexpr int64_t kLayoutRows = 128;

dnnl_data_type_t DataType(OnednnWeights::Kind kind) {
  return kind == OnednnWeights::Kind::kBf16 ? dnnl_bf16 : dnnl_f32;
}

dnnl_memory_desc_t Md2d(int64_t d0, int64_t d1, dnnl_data_type_t dt,
                        dnnl_format_tag_t tag) {
  dnnl_memory_desc_t md;
  const dnnl_dims_t dims = {d0, d1};
  dnnl_memory_desc_init_by_tag(&md, 2, dims, dt, tag);
  return md;
}

struct PrimKey {
  OnednnWeights::Kind kind;
  int64_t m, rows, cols;
  int threads;
  template <typename H>
  friend H AbslHashValue(H h, const PrimKey& k) {
    return H::combine(std::move(h), k.kind, k.m, k.rows, k.cols, k.threads);
  }
  bool operator==(const PrimKey&) const = default;
};

struct CachedPrim {
  dnnl_memory_desc_t weights_md;
  dnnl_primitive_t prim;
};

// Process-wide engine, stream and primitive cache. Never destroyed (safe to
// use from static destructors of callers; the OS reclaims it).
class Context {
 public:
  static Context& Get() {
    static Context* ctx = new Context();
    return *ctx;
  }
  bool ok() const { return engine_ != nullptr && stream_ != nullptr; }
  dnnl_engine_t engine() const { return engine_; }
  dnnl_stream_t stream() const { return stream_; }

  // Matmul primitive for key.m x key.cols times weights `wmd`; null if
  // oneDNN has none.
  dnnl_primitive_t Primitive(const PrimKey& key,
                             const dnnl_memory_desc_t& wmd) {
    absl::MutexLock lock(&mu_);
    std::vector<CachedPrim>& list = cache_[key];
    for (const CachedPrim& c : list) {
      if (dnnl_memory_desc_equal(&c.weights_md, &wmd)) return c.prim;
    }
    const dnnl_data_type_t dt = DataType(key.kind);
    const dnnl_memory_desc_t src = Md2d(key.m, key.cols, dt, dnnl_ab);
    const dnnl_memory_desc_t dst = Md2d(key.m, key.rows, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = nullptr;
    dnnl_primitive_t prim = nullptr;
    if (dnnl_matmul_desc_init(&desc, &src, &wmd, nullptr, &dst) !=
            dnnl_success ||
        dnnl_primitive_desc_create(&pd, &desc, nullptr, engine_, nullptr) !=
            dnnl_success) {
      return nullptr;
    }
    const dnnl_status_t st = dnnl_primitive_create(&prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) return nullptr;
    list.push_back({wmd, prim});
    return prim;
  }

 private:
  Context() {
    if (dnnl_engine_create(&engine_, dnnl_cpu, 0) != dnnl_success) {
      engine_ = nullptr;
      return;
    }
    if (dnnl_stream_create(&stream_, engine_, dnnl_stream_default_flags) !=
        dnnl_success) {
      stream_ = nullptr;
    }
  }

  dnnl_engine_t engine_ = nullptr;
  dnnl_stream_t stream_ = nullptr;
  absl::Mutex mu_;
  absl::flat_hash_map<PrimKey, std::vector<CachedPrim>> cache_
      ABSL_GUARDED_BY(mu_);
};

// oneDNN's OpenMP runtime sizes its parallel regions by omp_get_max_threads.
int SyncThreads() {
  const int n = NumThreads();
#ifdef KVSERVE_HAVE_OPENMP
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
#endif
  return n;
}

// Runs `prim` on src (m x cols) and dst (m x rows) buffers.
bool Execute(Context& ctx, dnnl_primitive_t prim, OnednnWeights::Kind kind,
             const dnnl_memory_desc_t& wmd, void* weights, int64_t m,
             int64_t rows, int64_t cols, void* src, float* dst) {
  const dnnl_memory_desc_t src_md = Md2d(m, cols, DataType(kind), dnnl_ab);
  const dnnl_memory_desc_t dst_md = Md2d(m, rows, dnnl_f32, dnnl_ab);
  dnnl_memory_t mem[3] = {nullptr, nullptr, nullptr};
  bool ok =
      dnnl_memory_create(&mem[0], &src_md, ctx.engine(), src) == dnnl_success &&
      dnnl_memory_create(&mem[1], &wmd, ctx.engine(), weights) ==
          dnnl_success &&
      dnnl_memory_create(&mem[2], &dst_md, ctx.engine(), dst) == dnnl_success;
  if (ok) {
    const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, mem[0]},
                                     {DNNL_ARG_WEIGHTS, mem[1]},
                                     {DNNL_ARG_DST, mem[2]}};
    ok = dnnl_primitive_execute(prim, ctx.stream(), 3, args) == dnnl_success &&
         dnnl_stream_wait(ctx.stream()) == dnnl_success;
  }
  for (dnnl_memory_t m : mem) {
    if (m != nullptr) dnnl_memory_destroy(m);
  }
  return ok;
}

// Scratch for padded / converted activations and padded outputs.
struct Scratch {
  AlignedBuffer src;
  AlignedBuffer dst;
};
Scratch& ThreadScratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

struct OnednnWeights::Impl {
  Kind kind = Kind::kBf16;
  int64_t rows = 0;
  int64_t cols = 0;
  dnnl_memory_desc_t md;
  AlignedBuffer buf;
};

OnednnWeights::OnednnWeights(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
OnednnWeights::~OnednnWeights() = default;
OnednnWeights::Kind OnednnWeights::kind() const { return impl_->kind; }
size_t OnednnWeights::bytes() const { return impl_->buf.size(); }

absl::StatusOr<std::unique_ptr<OnednnWeights>> OnednnWeights::Create(
    Kind kind, const void* src, int64_t rows, int64_t cols) {
  Context& ctx = Context::Get();
  if (!ctx.ok()) return absl::InternalError("oneDNN: no CPU engine");
  SyncThreads();
  const dnnl_data_type_t dt = DataType(kind);
  const dnnl_memory_desc_t plain = Md2d(cols, rows, dt, dnnl_ba);
  const dnnl_memory_desc_t any = Md2d(cols, rows, dt, dnnl_format_tag_any);
  const dnnl_memory_desc_t a = Md2d(kLayoutRows, cols, dt, dnnl_ab);
  const dnnl_memory_desc_t c = Md2d(kLayoutRows, rows, dnnl_f32, dnnl_ab);
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = nullptr;
  if (dnnl_matmul_desc_init(&desc, &a, &any, nullptr, &c) != dnnl_success ||
      dnnl_primitive_desc_create(&pd, &desc, nullptr, ctx.engine(), nullptr) !=
          dnnl_success) {
    return absl::InternalError(
        absl::StrCat("oneDNN: no matmul for ", rows, " x ", cols));
  }
  auto impl = std::make_unique<Impl>();
  impl->kind = kind;
  impl->rows = rows;
  impl->cols = cols;
  impl->md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
  dnnl_primitive_desc_destroy(pd);
  impl->buf.Resize(dnnl_memory_desc_get_size(&impl->md));

  dnnl_primitive_desc_t rpd = nullptr;
  dnnl_primitive_t reorder = nullptr;
  bool ok = dnnl_reorder_primitive_desc_create(&rpd, &plain, ctx.engine(),
                                               &impl->md, ctx.engine(),
                                               nullptr) == dnnl_success &&
            dnnl_primitive_create(&reorder, rpd) == dnnl_success;
  if (rpd != nullptr) dnnl_primitive_desc_destroy(rpd);
  dnnl_memory_t from = nullptr, to = nullptr;
  ok = ok &&
       dnnl_memory_create(&from, &plain, ctx.engine(),
                          const_cast<void*>(src)) == dnnl_success &&
       dnnl_memory_create(&to, &impl->md, ctx.engine(), impl->buf.data()) ==
           dnnl_success;
  if (ok) {
    const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    ok = dnnl_primitive_execute(reorder, ctx.stream(), 2, args) ==
             dnnl_success &&
         dnnl_stream_wait(ctx.stream()) == dnnl_success;
  }
  if (from != nullptr) dnnl_memory_destroy(from);
  if (to != nullptr) dnnl_memory_destroy(to);
  if (reorder != nullptr) dnnl_primitive_destroy(reorder);
  if (!ok) return absl::InternalError("oneDNN: weight reorder failed");
  return std::unique_ptr<OnednnWeights>(new OnednnWeights(std::move(impl)));
}

bool OnednnWeights::MatMul(const float* x, int64_t m, float* y) const {
  Context& ctx = Context::Get();
  if (!ctx.ok() || m <= 0) return m <= 0;
  const int threads = SyncThreads();
  const Impl& w = *impl_;
  struct Piece {
    int64_t row0, rows, padded;
    dnnl_primitive_t prim;
  };
  // Resolve every primitive first: an unsupported shape fails fast.
  absl::InlinedVector<Piece, 4> pieces;
  for (int64_t r0 = 0; r0 < m; r0 += kChunkRows) {
    const int64_t n = std::min(kChunkRows, m - r0);
    const int64_t padded = (n + kPadRows - 1) / kPadRows * kPadRows;
    dnnl_primitive_t prim =
        ctx.Primitive({w.kind, padded, w.rows, w.cols, threads}, w.md);
    if (prim == nullptr) return false;
    pieces.push_back({r0, n, padded, prim});
  }
  Scratch& s = ThreadScratch();
  const size_t elem = w.kind == Kind::kBf16 ? 2 : 4;
  for (const Piece& p : pieces) {
    const float* xp = x + p.row0 * w.cols;
    void* src = const_cast<float*>(xp);
    if (w.kind == Kind::kBf16 || p.padded != p.rows) {
      s.src.EnsureSize(p.padded * w.cols * elem);
      std::memset(s.src.data() + p.rows * w.cols * elem, 0,
                  (p.padded - p.rows) * w.cols * elem);
      src = s.src.data();
      if (w.kind == Kind::kBf16) {
        uint16_t* dst = s.src.as<uint16_t>();
        const int64_t grain = std::max<int64_t>(1, 16384 / w.cols);
        ParallelFor(p.rows, grain, [&](int64_t lo, int64_t hi) {
          ConvertToBf16(xp + lo * w.cols, (hi - lo) * w.cols,
                        dst + lo * w.cols);
        });
      } else {
        std::memcpy(src, xp, p.rows * w.cols * elem);
      }
    }
    float* dst = y + p.row0 * w.rows;
    if (p.padded != p.rows) {
      s.dst.EnsureSize(p.padded * w.rows * sizeof(float));
      dst = s.dst.as<float>();
    }
    if (!Execute(ctx, p.prim, w.kind, w.md, const_cast<uint8_t*>(w.buf.data()),
                 p.padded, w.rows, w.cols, src, dst)) {
      return false;
    }
    if (dst != y + p.row0 * w.rows) {
      std::memcpy(y + p.row0 * w.rows, dst, p.rows * w.rows * sizeof(float));
    }
  }
  return true;
}

std::string OnednnWeights::ImplName(int64_t m) const {
  Context& ctx = Context::Get();
  if (!ctx.ok()) return "";
  const int64_t padded =
      (std::min(m, kChunkRows) + kPadRows - 1) / kPadRows * kPadRows;
  dnnl_primitive_t prim = ctx.Primitive(
      {impl_->kind, padded, impl_->rows, impl_->cols, SyncThreads()},
      impl_->md);
  const_dnnl_primitive_desc_t pd = nullptr;
  const char* name = nullptr;
  if (prim == nullptr ||
      dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success ||
      dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) !=
          dnnl_success ||
      name == nullptr) {
    return "";
  }
  return name;
}

}  // namespace kvserve::models::cpu::internal
