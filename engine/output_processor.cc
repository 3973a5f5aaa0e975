#include "engine/output_processor.h"

#include <algorithm>

namespace kvserve::engine {

std::vector<int32_t> MinTokensStops(const RequestSpec& spec,
                                    const models::Tokenizer& tokenizer) {
  if (spec.sampling.min_tokens <= 0) return {};
  std::vector<int32_t> stops = spec.stop_token_ids;
  if (!spec.ignore_eos) {
    const models::TokenizerData& data = tokenizer.data();
    if (data.eos_id >= 0) stops.push_back(data.eos_id);
    stops.insert(stops.end(), data.extra_eos_ids.begin(),
                 data.extra_eos_ids.end());
  }
  return stops;
}

OutputProcessor::OutputProcessor(const RequestSpec& spec,
                                 const models::Tokenizer* tokenizer)
    : spec_(spec),
      tokenizer_(tokenizer),
      detok_(tokenizer, {.skip_special = spec.skip_special_tokens}) {
  for (const std::string& s : spec.stop) {
    max_stop_len_ = std::max(max_stop_len_, s.size());
  }
}

OutputProcessor::Step OutputProcessor::Accept(int32_t token) {
  Step step;
  ++accepted_;
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
  // Stop strings count from min_tokens on, as in vLLM.
  if (max_stop_len_ > 0 && accepted_ >= spec_.sampling.min_tokens) {
    // A match can only involve the new text and max_stop_len - 1 bytes
    // before it.
    const size_t from =
        before >= max_stop_len_ ? before - max_stop_len_ + 1 : 0;
    size_t best = std::string::npos;
    size_t best_len = 0;
    for (const std::string& s : spec_.stop) {
      if (s.empty()) continue;
      const size_t p = text_.find(s, from);
      if (p != std::string::npos && p < best) {
        best = p;
        best_len = s.size();
      }
    }
    if (best != std::string::npos) {
      stopped_ = true;
      step.stop = true;
      const size_t end =
          spec_.include_stop_str_in_output ? best + best_len : best;
      text_.resize(std::max(end, emitted_));
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
