// Per-request output state on the engine thread: incremental detokenization,
// stop conditions (EOS, stop token ids, stop strings), and the text held
// back while it could still become a stop string. Sampling state is the
// model runner's (RunnerRequest).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request_spec.h"
#include "models/tokenizer/detokenizer.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::engine {

// The tokens that would stop `spec` (EOS unless ignored, its stop token
// ids), masked while fewer than its min_tokens are out; empty without
// min_tokens.
[[nodiscard]] std::vector<int32_t> MinTokensStops(
    const RequestSpec& spec, const models::Tokenizer& tokenizer);

class OutputProcessor {
 public:
  OutputProcessor(const RequestSpec& spec, const models::Tokenizer* tokenizer);

  // Result of accepting one sampled token.
  struct Step {
    std::string text;   // text now safe to emit
    bool stop = false;  // a stop condition matched (finish kStop)
  };
  // Accepts `token` (already appended to the request's output).
  Step Accept(int32_t token);
  // Text still held back (call once when the request ends without a stop
  // string match).
  std::string Flush();

 private:
  // Emits text_[emitted_, end) where end keeps back a possible stop-string
  // prefix, moved back to a UTF-8 character boundary.
  std::string TakeSafeText();

  const RequestSpec& spec_;
  const models::Tokenizer* tokenizer_;
  models::Detokenizer detok_;
  int32_t accepted_ = 0;  // tokens accepted, the current one included
  std::string text_;      // generated text so far
  size_t emitted_ = 0;    // bytes of text_ already handed out
  size_t max_stop_len_ = 0;
  bool stopped_ = false;
};

}  // namespace kvserve::engine
