// Model architecture and tokenizer inputs from GGUF metadata: turns the
// `{arch}.*` keys into a ModelConfig and the `tokenizer.*` keys into
// TokenizerData. Owns the key names and their defaults; the GGUF container
// itself is parsed by gguf.h.
#pragma once

#include "absl/status/statusor.h"
#include "models/loader/gguf.h"
#include "models/model_config.h"
#include "models/tokenizer/tokenizer_data.h"

namespace kvserve::models {

// Architectures "llama", "mistral" (RoPE interleaved: GGUF converters permute
// Q/K for ggml's NORM rope) and "qwen2" (RoPE half-split). Reads
// {arch}.block_count, embedding_length, feed_forward_length,
// attention.head_count[_kv], attention.key_length, rope.dimension_count,
// rope.freq_base, attention.layer_norm_rms_epsilon, context_length,
// rope.scaling.*, attention.sliding_window, vocab_size (else the token list
// length); derives tied_embeddings (no output.weight), qkv_bias
// (blk.0.attn_q.bias present) and weight_dtype_bytes (4 when
// blk.0.attn_q.weight is F32, else 2). The result passes Validate().
[[nodiscard]] absl::StatusOr<ModelConfig> ModelConfigFromGguf(
    const GgufFile& file);

// tokenizer.ggml.model "gpt2" -> kByteLevelBpe, "llama" -> kSentencePieceBpe
// (others are InvalidArgument). Defaults when keys are absent: SentencePiece
// gets bos 1 / eos 2 / unk 0, add_bos and add_space_prefix true; byte-level
// BPE gets ids -1 and both flags false; pre "default". extra_eos_ids lists
// control tokens such as <|im_end|>, <|eot_id|>, <|end_of_text|>, </s>,
// <|endoftext|> found in the vocab, except eos itself.
[[nodiscard]] absl::StatusOr<TokenizerData> TokenizerDataFromGguf(
    const GgufFile& file);

}  // namespace kvserve::models
