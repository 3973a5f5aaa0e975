#include "models/sim/step_profile.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "absl/strings/str_format.h"

namespace kvserve::models::sim {
namespace {

constexpr int kTerms = 6;
using Row = std::array<double, kTerms>;

Row Features(const StepLoad& l) {
  return {1.0,
          static_cast<double>(l.tokens),
          static_cast<double>(l.seqs),
          static_cast<double>(l.attended),
          static_cast<double>(l.kv_read_tokens),
          l.tokens > l.seqs ? 1.0 : 0.0};
}

// Solves a x = b in place by Gaussian elimination with partial pivoting;
// false when a is (numerically) singular.
bool Solve(std::array<Row, kTerms>& a, Row& b) {
  for (int c = 0; c < kTerms; ++c) {
    int pivot = c;
    for (int r = c + 1; r < kTerms; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (std::abs(a[pivot][c]) < 1e-12) return false;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    for (int r = 0; r < kTerms; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < kTerms; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = 0; c < kTerms; ++c) b[c] /= a[c][c];
  return true;
}

}  // namespace

double StepProfile::Seconds(const StepLoad& l) const {
  const double s = base_s + per_token_s * l.tokens + per_seq_s * l.seqs +
                   per_attended_s * l.attended +
                   per_kv_read_s * l.kv_read_tokens +
                   (l.tokens > l.seqs ? prefill_s : 0.0);
  return std::max({s, base_s / 2, 0.0});
}

absl::StatusOr<StepProfile> FitStepProfile(
    const std::vector<StepSample>& samples) {
  if (samples.size() < kTerms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "step profile: %d steps, at least %d needed", samples.size(), kTerms));
  }
  // Columns scaled to unit size so the normal equations stay well
  // conditioned (attended keys reach 1e6 where the constant is 1).
  Row scale{};
  for (const StepSample& s : samples) {
    const Row x = Features(s.load);
    for (int k = 0; k < kTerms; ++k) scale[k] = std::max(scale[k], x[k]);
  }
  for (double& v : scale) v = v > 0 ? v : 1.0;
  std::array<Row, kTerms> ata{};
  Row atb{};
  // Ordinary least squares: the fit is the mean step time of a load, so
  // the times of many steps add up as measured (weighting by 1 / seconds
  // fits relative errors but biases every step low).
  for (const StepSample& s : samples) {
    Row x = Features(s.load);
    for (int k = 0; k < kTerms; ++k) x[k] /= scale[k];
    for (int i = 0; i < kTerms; ++i) {
      for (int j = 0; j < kTerms; ++j) ata[i][j] += x[i] * x[j];
      atb[i] += x[i] * s.seconds;
    }
  }
  // A column that never varies from zero (e.g. no cached K/V read) is
  // pinned to 0 rather than left undetermined.
  for (int k = 1; k < kTerms; ++k) {
    if (ata[k][k] == 0) ata[k][k] = 1;
  }
  if (!Solve(ata, atb)) {
    return absl::InvalidArgumentError(
        "step profile: the steps do not determine the coefficients (they "
        "need varied batch tokens, sequences and contexts)");
  }
  return StepProfile{atb[0] / scale[0], atb[1] / scale[1], atb[2] / scale[2],
                     atb[3] / scale[3], atb[4] / scale[4], atb[5] / scale[5]};
}

}  // namespace kvserve::models::sim
