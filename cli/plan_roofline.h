// The roofline section of `kvserve plan --gpu` (models/sim/roofline.h): the
// time of a decode step at the plan's concurrency (the requested one where
// it fits, else the most sequences that fit at --context) and of one --context
// prompt's prefill, with the efficiencies it assumes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cli/cli_plan.h"
#include "models/sim/gpu_specs.h"
#include "models/sim/roofline.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {

struct PlanRoofline {
  models::sim::GpuSpec gpu;
  models::sim::Efficiency eff;
  double weight_bytes = 0;  // per parameter
  int64_t seqs = 0;
  int64_t context = 0;
  models::sim::StepCost decode;
  models::sim::StepCost prefill;
};

// None without --gpu, for MLA models (no forward cost model yet), or when
// the weights leave no KV budget.
[[nodiscard]] std::optional<PlanRoofline> ComputePlanRoofline(const Plan& p);
[[nodiscard]] std::string RooflineText(const PlanRoofline& r);
[[nodiscard]] nlohmann::ordered_json RooflineJson(const PlanRoofline& r);

}  // namespace kvserve::cli
