#include "models/tokenizer/detokenizer.h"

#include <string_view>

#include "models/tokenizer/utf8.h"

namespace kvserve::models {

void Detokenizer::AddTo(int32_t id, std::string* out) {
  if (id < 0 || id >= tokenizer_->vocab_size()) return;
  if (options_.skip_special && tokenizer_->IsSpecial(id)) return;
  std::string_view piece = tokenizer_->TokenToPiece(id);
  if (first_ && options_.sequence_start && tokenizer_->strips_leading_space() &&
      piece.starts_with(' ')) {
    piece.remove_prefix(1);
  }
  first_ = false;
  if (pending_.empty()) {
    // Fast path: most pieces are complete characters.
    const size_t used = AppendCompleteUtf8(piece, out);
    pending_.assign(piece.substr(used));
    return;
  }
  pending_.append(piece);
  const size_t used = AppendCompleteUtf8(pending_, out);
  pending_.erase(0, used);
}

std::string Detokenizer::Add(int32_t id) {
  std::string out;
  AddTo(id, &out);
  return out;
}

std::string Detokenizer::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace kvserve::models
