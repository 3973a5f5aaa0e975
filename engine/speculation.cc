#include "engine/speculation.h"

#include <algorithm>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kvserve::engine {

absl::StatusOr<SpeculativeMode> ParseSpeculativeMode(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "off" || n.empty()) return SpeculativeMode::kOff;
  if (n == "ngram") return SpeculativeMode::kNgram;
  if (n == "draft") return SpeculativeMode::kDraft;
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative ", name, ": expected off, ngram or draft"));
}

const char* SpeculativeModeName(SpeculativeMode mode) {
  switch (mode) {
    case SpeculativeMode::kNgram:
      return "ngram";
    case SpeculativeMode::kDraft:
      return "draft";
    case SpeculativeMode::kOff:
      break;
  }
  return "off";
}

std::vector<int32_t> NgramDraft(const kvcache::TokenSequence& tokens,
                                int32_t ngram_max, int32_t ngram_min,
                                int32_t k) {
  const int32_t size = tokens.size();
  auto at = [&](int32_t i) {
    const auto p = static_cast<int32_t>(tokens.prompt.size());
    return i < p ? tokens.prompt[i] : tokens.output[i - p];
  };
  std::vector<int32_t> out;
  if (k <= 0) return out;
  for (int32_t n = std::min(ngram_max, size - 1); n >= ngram_min; --n) {
    // The latest start s < size - n whose n tokens equal the suffix's.
    for (int32_t s = size - n - 1; s >= 0; --s) {
      int32_t j = 0;
      while (j < n && at(s + j) == at(size - n + j)) ++j;
      if (j < n) continue;
      for (int32_t t = s + n; t < size && static_cast<int32_t>(out.size()) < k;
           ++t) {
        out.push_back(at(t));
      }
      return out;
    }
  }
  return out;
}

int32_t SpeculationControl::Draft(int32_t max_tokens, double cost_per_token) {
  if (skip_ > 0) {
    --skip_;
    return 0;
  }
  const double a = std::clamp(accept_rate_, 0.0, 0.98);
  int32_t best_k = 1;
  double best = 0, gain = 1, p = 1;
  for (int32_t k = 1; k <= max_tokens; ++k) {
    p *= a;
    gain += p;
    const double value = gain / (1.0 + k * cost_per_token);
    if (value > best * 1.0001) best = value, best_k = k;
  }
  return best_k;
}

void SpeculationCost::ObserveStep(double seconds, int64_t seqs,
                                  int64_t drafts) {
  if (seqs <= 0 || seconds <= 0) return;
  const double per_seq = seconds / static_cast<double>(seqs);
  if (drafts == 0) {
    plain_ = plain_ == 0 ? per_seq : 0.9 * plain_ + 0.1 * per_seq;
    return;
  }
  if (plain_ == 0) return;
  // The step's time over the same sequences' plain steps, per draft token.
  const double extra = (seconds - plain_ * static_cast<double>(seqs)) /
                       (plain_ * static_cast<double>(drafts));
  verify_ = std::clamp(0.9 * verify_ + 0.1 * extra, 0.0, 1.0);
  if (draft_secs_ > 0) propose_ = draft_secs_ / plain_;
}

void SpeculationCost::ObserveDraft(double seconds, int64_t drafts) {
  if (drafts <= 0) return;
  const double per = seconds / static_cast<double>(drafts);
  draft_secs_ = draft_secs_ == 0 ? per : 0.9 * draft_secs_ + 0.1 * per;
  if (plain_ > 0) propose_ = draft_secs_ / plain_;
}

void SpeculationControl::NoDraft() { skip_ = std::max(skip_, 1); }

void SpeculationControl::Observe(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  const double rate = static_cast<double>(accepted) / drafted;
  accept_rate_ = 0.7 * accept_rate_ + 0.3 * rate;
  if (accept_rate_ < 0.25) {
    // Mostly rejected: sit out 1, 2, 4, ... 64 steps, then try again.
    backoff_ = std::min(64, std::max(1, 2 * backoff_));
    skip_ = backoff_;
    accept_rate_ = 0.3;  // a fresh start after the pause
  } else if (rate > 0.5) {
    backoff_ = 0;
  }
}

}  // namespace kvserve::engine
