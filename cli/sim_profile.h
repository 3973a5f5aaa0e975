// Step profiles as files: what `kvserve sim-replay --profile-out` writes
// after a run on a real device and `--sim-profile` reads back
// (models/sim/step_profile.h).
//
//   {"kind": "kvserve-step-profile", "version": 1, "device": "cpu",
//    "model": "...", "steps": 812, "mape": 0.031,
//    "seconds": {"base": 0.004, "per_token": 0.0009, "per_seq": 0.0001,
//                "per_attended": 1e-8, "per_kv_read": 2e-8, "prefill": 0.007}}
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "models/sim/step_profile.h"

namespace kvserve::cli {

// Fits a profile to `steps` and writes it to `path`, with the fit's mean
// absolute percentage error over those steps.
[[nodiscard]] absl::Status WriteStepProfile(
    const std::string& path, const std::string& device,
    const std::string& model, const std::vector<engine::StepRecord>& steps);

// NotFound for a missing file; InvalidArgument naming the file and field.
[[nodiscard]] absl::StatusOr<models::sim::StepProfile> ReadStepProfile(
    const std::string& path);

// --device into e->device and, for a simulated device, e->sim: `base` (the
// --sim-* flags) with the flag's GPU and ranks and the profile read from
// `profile_path` (--sim-profile; empty: the roofline). InvalidArgument for
// a bad --device, or --sim-profile with a real device (never ignored).
[[nodiscard]] absl::Status ApplyDeviceFlags(const std::string& device,
                                            const engine::SimConfig& base,
                                            const std::string& profile_path,
                                            engine::EngineConfig* e);

}  // namespace kvserve::cli
