#include "cli/plan_tiers.h"

#include <optional>

#include "absl/strings/str_format.h"
#include "cli/plan_roofline.h"
#include "kvtier/block_codec.h"

namespace kvserve::cli {
namespace {

// Seconds of compute per prompt token: the roofline's prefill of --context
// with --gpu, else the measured rate the operator gives.
double RecomputeSecondsPerToken(const Plan& p) {
  if (const std::optional<PlanRoofline> r = ComputePlanRoofline(p)) {
    if (r->context > 0 && r->prefill.total_s > 0) {
      return r->prefill.total_s / static_cast<double>(r->context);
    }
  }
  const double tps = p.flags.prefill_tokens_per_second;
  return tps > 0 ? 1.0 / tps : 0;
}

// The host link of --gpu, bytes/s; 0 without one.
double HostLinkBytesPerSecond(const Plan& p) {
  if (p.flags.gpu.empty()) return 0;
  absl::StatusOr<models::sim::GpuSpec> g = models::sim::FindGpu(p.flags.gpu);
  return g.ok() ? g->host_link_bw : 0;
}

}  // namespace

std::vector<PlanTier> ComputePlanTiers(const Plan& p) {
  const int64_t block = p.flags.block_size;
  const int64_t payload = p.kv.bytes_per_block;
  const double recompute = RecomputeSecondsPerToken(p);
  struct Spec {
    const char* name;
    int64_t bytes;
    bool stored;  // files and values carry a header
    double rate;
  };
  const Spec specs[] = {
      {"host", p.flags.host_cache_bytes, false, HostLinkBytesPerSecond(p)},
      {"disk", p.flags.disk_cache_bytes, true, p.flags.disk_read_gbps * 1e9},
      {"remote", p.flags.remote_cache_bytes, true, p.flags.remote_gbps * 1e9},
  };
  std::vector<PlanTier> out;
  for (const Spec& s : specs) {
    if (s.bytes <= 0 || payload <= 0) continue;
    PlanTier t;
    t.name = s.name;
    t.bytes = s.bytes;
    t.stored_bytes_per_block =
        s.stored ? static_cast<int64_t>(kvtier::StoredBlockBytes(payload))
                 : payload;
    t.tokens = s.bytes / t.stored_bytes_per_block * block;
    t.sequences = p.flags.context > 0 ? t.tokens / p.flags.context : 0;
    t.load_bytes_per_s = s.rate;
    if (s.rate > 0) {
      t.load_s_per_token =
          static_cast<double>(t.stored_bytes_per_block) / block / s.rate;
    }
    t.recompute_s_per_token = recompute;
    t.slower_than_recompute = t.load_s_per_token > 0 && recompute > 0 &&
                              t.load_s_per_token > recompute;
    out.push_back(t);
  }
  return out;
}

std::string TiersText(const std::vector<PlanTier>& tiers) {
  std::string out;
  for (const PlanTier& t : tiers) {
    std::string line = absl::StrFormat(
        "%s: %lld tokens, %lld sequences at --context (%lld bytes a "
        "stored block)",
        absl::StrFormat("%.1f GiB", t.bytes / 1073741824.0),
        static_cast<long long>(t.tokens), static_cast<long long>(t.sequences),
        static_cast<long long>(t.stored_bytes_per_block));
    if (t.load_s_per_token > 0) {
      absl::StrAppendFormat(&line, "; load %.3f ms per 1K tokens at %.2f GB/s",
                            t.load_s_per_token * 1e6, t.load_bytes_per_s / 1e9);
    }
    if (t.load_s_per_token > 0 && t.recompute_s_per_token > 0) {
      const double x = t.recompute_s_per_token / t.load_s_per_token;
      absl::StrAppendFormat(
          &line, " vs recompute %.3f ms: %s", t.recompute_s_per_token * 1e6,
          t.slower_than_recompute
              ? absl::StrFormat(
                    "WARNING %.1fx SLOWER than recompute; the daemon would "
                    "skip these loads",
                    1 / x)
              : absl::StrFormat("%.1fx faster", x));
    } else if (t.recompute_s_per_token <= 0) {
      absl::StrAppend(&line,
                      " (recompute unknown: --gpu or "
                      "--prefill-tokens-per-second)");
    }
    absl::StrAppendFormat(&out, "%-16s %s\n", t.name + " tier", line);
  }
  return out;
}

nlohmann::ordered_json TiersJson(const std::vector<PlanTier>& tiers) {
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const PlanTier& t : tiers) {
    a.push_back({{"name", t.name},
                 {"bytes", t.bytes},
                 {"stored_bytes_per_block", t.stored_bytes_per_block},
                 {"tokens", t.tokens},
                 {"sequences", t.sequences},
                 {"load_bytes_per_second", t.load_bytes_per_s},
                 {"load_seconds_per_token", t.load_s_per_token},
                 {"recompute_seconds_per_token", t.recompute_s_per_token},
                 {"slower_than_recompute", t.slower_than_recompute}});
  }
  return a;
}

}  // namespace kvserve::cli
