#include "cli/plan_roofline.h"

#include "absl/strings/str_format.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::cli {

std::optional<PlanRoofline> ComputePlanRoofline(const Plan& p) {
  if (p.budget != Plan::Budget::kGpu || p.config.IsMla() ||
      p.budget_bytes == 0) {
    return std::nullopt;
  }
  absl::StatusOr<models::sim::GpuSpec> gpu = models::sim::FindGpu(p.flags.gpu);
  if (!gpu.ok()) return std::nullopt;
  PlanRoofline r;
  r.gpu = *gpu;
  r.eff.memory = p.flags.memory_efficiency;
  r.eff.flops = p.flags.flops_efficiency;
  r.eff.host_s_per_seq = p.flags.host_us_per_seq * 1e-6;
  r.weight_bytes = p.flags.weight_bytes > 0 ? p.flags.weight_bytes
                                            : p.config.weight_dtype_bytes;
  r.context = p.flags.context;
  // The requested concurrency where it fits, else as many as fit.
  r.seqs = p.flags.concurrency > 0 && p.kv.concurrency_fits
               ? p.flags.concurrency
               : std::max<int64_t>(1, p.kv.paged_seqs_at_context);
  const models::sim::Roofline model(p.config, r.gpu, p.flags.tp, r.weight_bytes,
                                    p.kv.bytes_per_token, r.eff,
                                    p.flags.kv_dtype == kvcache::KvDtype::kFP8
                                        ? models::sim::AttentionUnits::kFp8
                                        : models::sim::AttentionUnits::kBf16);
  r.decode = model.Decode(r.seqs, r.context);
  r.prefill = model.Prefill(r.context);
  return r;
}

namespace {

std::string Bound(const models::sim::StepCost& c) {
  return c.compute_bound ? "compute-bound" : "memory-bound";
}

}  // namespace

std::string RooflineText(const PlanRoofline& r) {
  const models::sim::StepCost& d = r.decode;
  std::string out = absl::StrFormat(
      "%-16s %s: %.2f TB/s x %.2f, %.0f TFLOP/s %s x %.2f (estimates, not "
      "measurements)\n",
      "roofline", r.gpu.part, r.gpu.memory_bw / 1e12, r.eff.memory,
      (r.weight_bytes <= 1 && r.gpu.fp8_flops > 0 ? r.gpu.fp8_flops
                                                  : r.gpu.bf16_flops) /
          1e12,
      r.weight_bytes <= 1 && r.gpu.fp8_flops > 0 ? "fp8" : "bf16", r.eff.flops);
  absl::StrAppendFormat(
      &out,
      "%-16s %lld sequences x %lld tokens: %.2f ms a step (weights %.2f + KV "
      "%.2f ms read, %.2f ms compute, %.2f ms all-reduce, %.2f ms host; %s), "
      "%.0f tokens/s\n",
      "decode step", static_cast<long long>(r.seqs),
      static_cast<long long>(r.context), d.total_s * 1e3, d.weights_s * 1e3,
      d.kv_s * 1e3, d.compute_s * 1e3, d.allreduce_s * 1e3, d.host_s * 1e3,
      Bound(d), static_cast<double>(r.seqs) / d.total_s);
  absl::StrAppendFormat(&out, "%-16s one %lld-token prompt: %.1f ms (%s)\n",
                        "prefill", static_cast<long long>(r.context),
                        r.prefill.total_s * 1e3, Bound(r.prefill));
  return out;
}

nlohmann::ordered_json RooflineJson(const PlanRoofline& r) {
  const auto cost = [](const models::sim::StepCost& c) {
    return nlohmann::ordered_json{{"seconds", c.total_s},
                                  {"weights_seconds", c.weights_s},
                                  {"kv_seconds", c.kv_s},
                                  {"compute_seconds", c.compute_s},
                                  {"allreduce_seconds", c.allreduce_s},
                                  {"host_seconds", c.host_s},
                                  {"compute_bound", c.compute_bound}};
  };
  nlohmann::ordered_json j{{"gpu", r.gpu.name},
                           {"memory_efficiency", r.eff.memory},
                           {"flops_efficiency", r.eff.flops},
                           {"host_us_per_seq", r.eff.host_s_per_seq * 1e6},
                           {"weight_bytes", r.weight_bytes},
                           {"decode_sequences", r.seqs},
                           {"context", r.context}};
  j["decode_step"] = cost(r.decode);
  j["decode_tokens_per_second"] =
      static_cast<double>(r.seqs) / r.decode.total_s;
  j["prefill"] = cost(r.prefill);
  return j;
}

}  // namespace kvserve::cli
