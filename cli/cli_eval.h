// `kvserve eval`: the KV-cache quality gate. Runs teacher-forced windows of a
// text through the CPU model once with f32 KV (the reference) and once per
// requested KV dtype, each with its own KV storage, decoding through the
// stored cache in chunks (every attention read goes through the dtype), and
// reports per dtype: perplexity, its change vs f32, mean KL divergence from
// f32, top-1 agreement with f32, and the KV footprint. The method mirrors
// llama.cpp's llama-perplexity (non-overlapping windows, BOS at each window
// start when the model adds one, second half of each window scored).
#pragma once

namespace kvserve::cli {

// Returns the process exit code: 0 ok, 1 runtime failure, 2 bad flags.
int RunEvalCommand(int argc, const char* const* argv);

}  // namespace kvserve::cli
