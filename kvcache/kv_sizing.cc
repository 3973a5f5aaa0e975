#include "kvcache/kv_sizing.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_format.h"
#include "common/check.h"
#include "common/status_macros.h"

namespace kvserve::kvcache {
namespace {

// Products above this are rejected so int64 arithmetic cannot overflow.
constexpr double kMaxBytes = 1e18;

absl::Status CheckRange(const char* field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV plan: %s must be in [%d, %d], got %d", field, lo, hi, v));
  }
  return absl::OkStatus();
}

int64_t NaiveMaxLen(const KvPlanInput& in) {
  return in.naive_max_len > 0 ? in.naive_max_len : in.context_len;
}

}  // namespace

int KvHeadsPerRank(int num_kv_heads, int tp) {
  KV_CHECK(num_kv_heads >= 1 && tp >= 1, "num_kv_heads=", num_kv_heads,
           " tp=", tp);
  return (num_kv_heads + tp - 1) / tp;
}

int64_t KvBytesPerToken(const KvShape& shape, KvDtype dtype, int tp) {
  KV_CHECK(tp >= 1, "tp=", tp);
  if (shape.IsLatent()) {
    KV_CHECK(shape.num_layers >= 1 && shape.qk_rope_head_dim >= 0,
             "num_layers=", shape.num_layers,
             " qk_rope_head_dim=", shape.qk_rope_head_dim);
    return int64_t{shape.num_layers} * KvRowBytes(dtype, shape.LatentDim());
  }
  KV_CHECK(shape.num_layers >= 1 && shape.head_dim >= 1,
           "num_layers=", shape.num_layers, " head_dim=", shape.head_dim);
  return int64_t{2} * shape.num_layers *
         KvHeadsPerRank(shape.num_kv_heads, tp) *
         KvRowBytes(dtype, shape.head_dim);
}

int64_t KvBytesPerBlock(const KvShape& shape, KvDtype dtype, int block_size,
                        int tp) {
  KV_CHECK(block_size >= 1, "block_size=", block_size);
  KV_CHECK(tp >= 1, "tp=", tp);
  // Through the format's block bytes: a format quantized across a block's
  // tokens is not a per-token multiple.
  if (shape.IsLatent()) {
    return int64_t{shape.num_layers} *
           KvFormatBlockBytes(dtype, shape.LatentDim(), block_size);
  }
  return int64_t{2} * shape.num_layers *
         KvHeadsPerRank(shape.num_kv_heads, tp) *
         KvFormatBlockBytes(dtype, shape.head_dim, block_size);
}

int64_t BlocksForTokens(int64_t tokens, int block_size) {
  KV_CHECK(tokens >= 0 && block_size >= 1, "tokens=", tokens,
           " block_size=", block_size);
  return (tokens + block_size - 1) / block_size;
}

// The per-layer part of the shape: GQA heads, or the MLA latent row (whose
// dtype groups must tile it).
absl::Status ValidateKvRows(const KvPlanInput& in) {
  if (!in.shape.IsLatent()) {
    KV_RETURN_IF_ERROR(
        CheckRange("num_kv_heads", in.shape.num_kv_heads, 1, 65536));
    return CheckRange("head_dim", in.shape.head_dim, 1, 65536);
  }
  KV_RETURN_IF_ERROR(
      CheckRange("kv_lora_rank", in.shape.kv_lora_rank, 1, 65536));
  KV_RETURN_IF_ERROR(
      CheckRange("qk_rope_head_dim", in.shape.qk_rope_head_dim, 0, 65536));
  return CheckKvDtypeShape(in.dtype, in.shape.LatentDim());
}

absl::Status ValidateKvPlanInput(const KvPlanInput& in) {
  KV_RETURN_IF_ERROR(ValidateKvRows(in));
  for (absl::Status s :
       {CheckRange("num_layers", in.shape.num_layers, 1, 4096),
        CheckRange("tp", in.tp, 1, 4096),
        CheckRange("block_size", in.block_size, 1, 1 << 20),
        CheckRange("context_len", in.context_len, 1, int64_t{1} << 40),
        CheckRange("naive_max_len", in.naive_max_len, 0, int64_t{1} << 40),
        CheckRange("mean_len", in.mean_len, 0, NaiveMaxLen(in)),
        CheckRange("concurrency", in.concurrency, 0, int64_t{1} << 40),
        CheckRange("budget_bytes", in.budget_bytes, 0, int64_t{1} << 60)}) {
    if (!s.ok()) return s;
  }
  const double per_token =
      in.shape.IsLatent()
          ? 1.0 * in.shape.num_layers *
                static_cast<double>(KvRowBytes(in.dtype, in.shape.LatentDim()))
          : 2.0 * in.shape.num_layers *
                KvHeadsPerRank(in.shape.num_kv_heads, in.tp) *
                static_cast<double>(KvRowBytes(in.dtype, in.shape.head_dim));
  const double longest = static_cast<double>(
      std::max(NaiveMaxLen(in),
               BlocksForTokens(in.context_len, in.block_size) * in.block_size));
  const double seqs = std::max<double>(1.0, in.concurrency);
  if (per_token * longest * seqs > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV plan: %.3g bytes (context x concurrency x bytes per token) is "
        "beyond any real memory",
        per_token * longest * seqs));
  }
  return absl::OkStatus();
}

KvPlan ComputeKvPlan(const KvPlanInput& in) {
  const absl::Status valid = ValidateKvPlanInput(in);
  KV_CHECK(valid.ok(), "", valid.ToString());
  KvPlan p;
  p.kv_heads_per_rank =
      in.shape.IsLatent() ? 1 : KvHeadsPerRank(in.shape.num_kv_heads, in.tp);
  p.bytes_per_token = KvBytesPerToken(in.shape, in.dtype, in.tp);
  p.bytes_per_block = p.bytes_per_token * in.block_size;
  p.bytes_per_seq = p.bytes_per_token * in.context_len;
  p.blocks_per_seq = BlocksForTokens(in.context_len, in.block_size);
  p.paged_bytes_per_seq = p.blocks_per_seq * p.bytes_per_block;
  p.bytes_for_concurrency = in.concurrency * p.paged_bytes_per_seq;

  const int64_t naive_max = NaiveMaxLen(in);
  const int64_t naive_bytes_per_seq = naive_max * p.bytes_per_token;
  if (in.budget_bytes > 0) {
    p.budget_blocks = in.budget_bytes / p.bytes_per_block;
    p.paged_seqs_at_context = in.budget_bytes / p.paged_bytes_per_seq;
    p.naive_seqs = in.budget_bytes / naive_bytes_per_seq;
    p.concurrency_fits = p.bytes_for_concurrency <= in.budget_bytes;
    if (in.mean_len > 0) {
      p.paged_seqs_at_mean =
          in.budget_bytes /
          (BlocksForTokens(in.mean_len, in.block_size) * p.bytes_per_block);
    }
  }
  if (in.mean_len > 0) {
    p.naive_idle_bytes_per_seq = (naive_max - in.mean_len) * p.bytes_per_token;
    p.naive_idle_fraction =
        static_cast<double>(naive_max - in.mean_len) / naive_max;
    // NOTE: the last block of a sequence is on average half full, so paging
    // holds about block/2 idle tokens per sequence, whatever its length.
    const double half_block = in.block_size / 2.0;
    p.paged_idle_bytes_per_seq =
        static_cast<int64_t>(half_block * p.bytes_per_token);
    p.paged_idle_fraction = half_block / (in.mean_len + half_block);
  }
  return p;
}

}  // namespace kvserve::kvcache
