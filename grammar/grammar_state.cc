// GrammarState over XGrammar's GrammarMatcher. See grammar_state.h.
#include "grammar/grammar_state.h"

#include <bit>
#include <limits>
#include <utility>

#include "grammar/grammar_internal.h"

namespace kvserve::grammar {

struct GrammarState::Impl {
  Impl(std::shared_ptr<const CompiledGrammar> g, xgrammar::GrammarMatcher m)
      : grammar(std::move(g)),
        matcher(std::move(m)),
        bitmask(xgrammar::GetBitmaskSize(grammar->impl().vocab_size)) {}

  // A DLTensor over `bitmask` (int32, one dimension), as XGrammar fills it.
  DLTensor Tensor() {
    DLTensor t{};
    t.data = bitmask.data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = xgrammar::GetBitmaskDLType();
    t.shape = &bitmask_len;
    t.strides = nullptr;
    t.byte_offset = 0;
    return t;
  }

  std::shared_ptr<const CompiledGrammar> grammar;  // outlives the matcher
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> bitmask;
  int64_t bitmask_len = static_cast<int64_t>(bitmask.size());
  // `bitmask` is the mask after the tokens accepted so far; `restricts`:
  // it is not all ones.
  bool mask_ready = false;
  bool restricts = false;
};

GrammarState::GrammarState(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
GrammarState::~GrammarState() = default;

absl::StatusOr<std::unique_ptr<GrammarState>> GrammarState::Create(
    std::shared_ptr<const CompiledGrammar> grammar,
    std::vector<int32_t> stop_ids) {
  const CompiledGrammar::Impl& g = grammar->impl();
  if (stop_ids.empty()) stop_ids = g.eog_ids;
  for (const int32_t id : stop_ids) {
    if (id < 0 || id >= g.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token ", id, " is outside the vocabulary"));
    }
  }
  try {
    xgrammar::GrammarMatcher matcher(g.compiled, std::move(stop_ids));
    return std::unique_ptr<GrammarState>(new GrammarState(
        std::make_unique<Impl>(std::move(grammar), std::move(matcher))));
  } catch (const std::exception& e) {
    return FromException("grammar matcher", e);
  }
}

void GrammarState::FillMask() {
  Impl& s = *impl_;
  if (s.mask_ready || s.matcher.IsTerminated()) return;
  DLTensor t = s.Tensor();
  s.restricts = s.matcher.FillNextTokenBitmask(&t);
  s.mask_ready = true;
}

int32_t GrammarState::MaskLogits(absl::Span<float> logits) {
  Impl& s = *impl_;
  if (s.matcher.IsTerminated()) {
    std::fill(logits.begin(), logits.end(),
              -std::numeric_limits<float>::infinity());
    return 0;
  }
  FillMask();
  if (!s.restricts) {
    return static_cast<int32_t>(logits.size());  // all allowed
  }
  // Bit i of word w allows token 32 * w + i.
  const int64_t n = static_cast<int64_t>(logits.size());
  int32_t allowed = 0;
  for (int64_t w = 0; w < s.bitmask_len; ++w) {
    const auto word = static_cast<uint32_t>(s.bitmask[w]);
    allowed += std::popcount(word);
    if (word == 0xffffffffu) continue;
    const int64_t base = 32 * w;
    for (int64_t i = 0; i < 32 && base + i < n; ++i) {
      if ((word >> i & 1u) == 0) {
        logits[base + i] = -std::numeric_limits<float>::infinity();
      }
    }
  }
  return allowed;
}

bool GrammarState::Accept(int32_t token) {
  try {
    const bool ok = impl_->matcher.AcceptToken(token);
    if (ok) impl_->mask_ready = false;
    return ok;
  } catch (const std::exception&) {
    return false;
  }
}

void GrammarState::Rollback(int32_t tokens) {
  if (tokens <= 0) return;
  impl_->matcher.Rollback(tokens);
  impl_->mask_ready = false;
}

std::unique_ptr<GrammarState> GrammarState::Fork() const {
  return std::unique_ptr<GrammarState>(new GrammarState(
      std::make_unique<Impl>(impl_->grammar, impl_->matcher.Fork())));
}

bool GrammarState::mask_ready() const { return impl_->mask_ready; }
bool GrammarState::terminated() const { return impl_->matcher.IsTerminated(); }
bool GrammarState::completed() const { return impl_->matcher.IsCompleted(); }

}  // namespace kvserve::grammar
