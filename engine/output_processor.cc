#include "engine/output_processor.h"

#include <algorithm>

namespace kvserve::engine {

OutputProcessor::OutputProcessor(const RequestSpec& spec,
                                 const models::Tokenizer* tokenizer)
    : spec_(spec),
      tokenizer_(tokenizer),
      sampler_(spec.sampling.seed),
      detok_(tokenizer) {
  for (const std::string& s : spec.stop) {
    max_stop_len_ = std::max(max_stop_len_, s.size());
  }
}

OutputProcessor::Step OutputProcessor::Accept(int32_t token) {
  Step step;
  if (stopped_) return step;
  const bool eos = !spec_.ignore_eos && tokenizer_->IsEog(token);
  const bool stop_id =
      std::find(spec_.stop_token_ids.begin(), spec_.stop_token_ids.end(),
                token) != spec_.stop_token_ids.end();
  if (eos || stop_id) {
    // The stop token itself adds no text.
    stopped_ = true;
    step.stop = true;
    step.text = Flush();
    return step;
  }
  if (!spec_.detokenize) return step;
  const size_t before = text_.size();
  detok_.AddTo(token, &text_);
  if (max_stop_len_ > 0) {
    // A match can only involve the new text and max_stop_len - 1 bytes
    // before it.
    const size_t from =
        before >= max_stop_len_ ? before - max_stop_len_ + 1 : 0;
    size_t best = std::string::npos;
    for (const std::string& s : spec_.stop) {
      if (s.empty()) continue;
      const size_t p = text_.find(s, from);
      if (p != std::string::npos) best = std::min(best, p);
    }
    if (best != std::string::npos) {
      stopped_ = true;
      step.stop = true;
      text_.resize(std::max(best, emitted_));
      step.text = text_.substr(emitted_);
      emitted_ = text_.size();
      return step;
    }
  }
  step.text = TakeSafeText();
  return step;
}

std::string OutputProcessor::TakeSafeText() {
  size_t end = text_.size();
  if (max_stop_len_ > 1) {
    end = end > max_stop_len_ - 1 ? end - (max_stop_len_ - 1) : 0;
    // Never split a UTF-8 sequence: back up over continuation bytes.
    while (end > emitted_ && end < text_.size() &&
           (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) {
      --end;
    }
  }
  if (end <= emitted_) return "";
  std::string out = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  return out;
}

std::string OutputProcessor::Flush() {
  if (spec_.detokenize) text_ += detok_.Flush();
  std::string out = text_.substr(std::min(emitted_, text_.size()));
  emitted_ = text_.size();
  return out;
}

}  // namespace kvserve::engine
