#include "cli/sim_profile.h"

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {
namespace {

constexpr char kKind[] = "kvserve-step-profile";
constexpr const char* kTerms[] = {"base",         "per_token",   "per_seq",
                                  "per_attended", "per_kv_read", "prefill"};
constexpr int kNumTerms = 6;

double* Term(models::sim::StepProfile& p, int i) {
  double* terms[] = {&p.base_s,         &p.per_token_s,   &p.per_seq_s,
                     &p.per_attended_s, &p.per_kv_read_s, &p.prefill_s};
  return terms[i];
}

}  // namespace

absl::Status WriteStepProfile(const std::string& path,
                              const std::string& device,
                              const std::string& model,
                              const std::vector<engine::StepRecord>& steps) {
  std::vector<models::sim::StepSample> samples;
  samples.reserve(steps.size());
  for (const engine::StepRecord& r : steps) {
    samples.push_back({r.load, r.seconds});
  }
  KV_ASSIGN_OR_RETURN(models::sim::StepProfile p,
                      models::sim::FitStepProfile(samples));
  double ape = 0;
  for (const models::sim::StepSample& s : samples) {
    ape += std::abs(p.Seconds(s.load) - s.seconds) / std::max(s.seconds, 1e-9);
  }
  nlohmann::ordered_json j{
      {"kind", kKind},         {"version", 1},
      {"device", device},      {"model", model},
      {"steps", steps.size()}, {"mape", ape / samples.size()}};
  for (int i = 0; i < kNumTerms; ++i) j["seconds"][kTerms[i]] = *Term(p, i);
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile-out ", path, ": cannot write"));
  }
  return absl::OkStatus();
}

absl::StatusOr<models::sim::StepProfile> ReadStepProfile(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--sim-profile ", path, ": cannot open the file"));
  }
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sim-profile ", path, ": ", why));
  };
  if (!j.is_object() || j.value("kind", "") != kKind) {
    return bad(absl::StrCat("not a step profile (\"kind\": \"", kKind, "\")"));
  }
  if (j.value("version", 0) != 1) return bad("\"version\" must be 1");
  const auto seconds = j.find("seconds");
  if (seconds == j.end() || !seconds->is_object()) {
    return bad("\"seconds\" is missing");
  }
  models::sim::StepProfile p;
  for (int i = 0; i < kNumTerms; ++i) {
    const auto v = seconds->find(kTerms[i]);
    if (v == seconds->end() || !v->is_number() ||
        !std::isfinite(v->get<double>())) {
      return bad(absl::StrCat("\"seconds\".\"", kTerms[i],
                              "\" must be a finite number"));
    }
    *Term(p, i) = v->get<double>();
  }
  return p;
}

absl::Status ApplyDeviceFlags(const std::string& device,
                              const engine::SimConfig& base,
                              const std::string& profile_path,
                              engine::EngineConfig* e) {
  KV_ASSIGN_OR_RETURN(e->device, engine::ParseDevice(device));
  if (e->device != engine::Device::kSim) {
    if (profile_path.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(
        "--sim-profile: needs --device sim:<gpu>[x<tp>]");
  }
  KV_ASSIGN_OR_RETURN(e->sim, engine::ParseSimTarget(device, base));
  if (!profile_path.empty()) {
    KV_ASSIGN_OR_RETURN(models::sim::StepProfile profile,
                        ReadStepProfile(profile_path));
    e->sim.profile = std::make_shared<const models::sim::StepProfile>(profile);
  }
  return absl::OkStatus();
}

}  // namespace kvserve::cli
