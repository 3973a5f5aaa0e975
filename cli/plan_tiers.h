// The tiers section of `kvserve plan`: what the KV tiers below the pool
// hold (--host-cache-bytes, --disk-cache-bytes, --remote-cache-bytes) in
// tokens and --context sequences, and whether loading a prefix from each
// is predicted faster than computing it again: load time per token at the
// tier's rate (--gpu's host link; --disk-read-gbps; --remote-gbps) against
// the recompute time per token (the roofline's prefill with --gpu, else
// --prefill-tokens-per-second). A tier predicted slower is flagged: the
// daemon would measure the same and skip its loads (loads_skipped
// {reason="slower"}), so its bytes would buy nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli_plan.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {

struct PlanTier {
  std::string name;  // host, disk, remote
  int64_t bytes = 0;
  int64_t stored_bytes_per_block = 0;  // with the tier's header and padding
  int64_t tokens = 0;
  int64_t sequences = 0;             // of --context tokens
  double load_bytes_per_s = 0;       // 0: no rate known (host without --gpu)
  double load_s_per_token = 0;       // 0 when unknown
  double recompute_s_per_token = 0;  // 0 when unknown
  bool slower_than_recompute = false;
};

// One entry per tier with bytes > 0.
[[nodiscard]] std::vector<PlanTier> ComputePlanTiers(const Plan& p);
[[nodiscard]] std::string TiersText(const std::vector<PlanTier>& tiers);
[[nodiscard]] nlohmann::ordered_json TiersJson(
    const std::vector<PlanTier>& tiers);

}  // namespace kvserve::cli
