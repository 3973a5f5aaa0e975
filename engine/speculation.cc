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

int32_t SpeculationControl::Draft(int32_t max_tokens) {
  if (skip_ > 0) {
    --skip_;
    return 0;
  }
  // Proposes about as many as it expects to be accepted, and one more.
  const double expect = accept_rate_ / std::max(1e-3, 1.0 - accept_rate_);
  return std::clamp(static_cast<int32_t>(expect) + 1, 1, max_tokens);
}

void SpeculationControl::NoDraft() {
  constexpr int32_t kMaxMissSkip = 8;
  misses_ = std::min(misses_ + 1, kMaxMissSkip);
  skip_ = std::max(skip_, misses_);
}

void SpeculationControl::Observe(int32_t drafted, int32_t accepted) {
  if (drafted <= 0) return;
  misses_ = 0;
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
