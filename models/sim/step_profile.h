// A measured step-time model, the alternative to the roofline: a step of
// load L takes base + per_token x tokens + per_seq x seqs + per_attended x
// attended keys + per_kv_read x cached K/V tokens read, + prefill when some
// sequence brings more than one token (a prefill chunk), with the
// coefficients fitted by least squares to the steps a real engine ran
// (`kvserve sim-replay --device cpu --profile-out FILE`). The simulated
// device then runs on it (`--sim-profile FILE`), so a replay on the machine
// that made the profile predicts what the real engine does there.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/sim/roofline.h"

namespace kvserve::models::sim {

struct StepProfile {
  double base_s = 0, per_token_s = 0, per_seq_s = 0, per_attended_s = 0,
         per_kv_read_s = 0, prefill_s = 0;

  // The modelled seconds of `load`; never below base_s / 2 nor below 0.
  [[nodiscard]] double Seconds(const StepLoad& load) const;
};

struct StepSample {
  StepLoad load;
  double seconds = 0;
};

// Least squares over `samples`. InvalidArgument when they are fewer than
// the six coefficients or do not determine them (e.g. every step the same
// shape).
[[nodiscard]] absl::StatusOr<StepProfile> FitStepProfile(
    const std::vector<StepSample>& samples);

}  // namespace kvserve::models::sim
