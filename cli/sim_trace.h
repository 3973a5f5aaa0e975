// The requests a trace replay (`kvserve sim-replay`) submits: read from a
// JSON-lines file or drawn from a seeded generator (Poisson arrivals,
// lognormal lengths, shared prefixes), and turned into token ids.
//
// Trace file: one JSON object per line, blank lines and lines starting with
// '#' skipped:
//   {"arrival": 0.25, "input_len": 512, "output_len": 128,
//    "prefix_id": 3, "prefix_len": 256}
// arrival: seconds from the start (non-decreasing); input_len >= 1 tokens
// of prompt, of which the first prefix_len are prefix prefix_id's, shared
// with every request naming the same prefix_id (both optional);
// output_len >= 1 tokens generated (the request ignores EOS).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvserve::cli {

struct TraceRequest {
  double arrival = 0;  // seconds
  int32_t input_len = 0;
  int32_t output_len = 0;
  int32_t prefix_id = -1;  // -1: no shared prefix
  int32_t prefix_len = 0;
};

// InvalidArgument naming the file, line and field for a malformed line or
// an out-of-range value; NotFound for a missing file.
[[nodiscard]] absl::StatusOr<std::vector<TraceRequest>> ReadTrace(
    const std::string& path);

struct SyntheticTraceSpec {
  int64_t num_requests = 1000;
  double request_rate = 0;   // per second, Poisson; 0: all at time 0
  int32_t input_len = 512;   // median
  int32_t output_len = 128;  // median
  double input_sigma = 0;    // lognormal sigma; 0: every request the median
  double output_sigma = 0;
  int32_t num_prefixes = 0;  // request i shares prefix i mod num_prefixes
  int32_t prefix_len = 0;    // tokens of each shared prefix (in input_len)
  int32_t max_len = 8192;    // input + output are clipped to it
  uint64_t seed = 0;
};

[[nodiscard]] std::vector<TraceRequest> SyntheticTrace(
    const SyntheticTraceSpec& spec);

// The prompt of `r`: its prefix's tokens (the same for every request naming
// that prefix) then its own, seeded by `seed` and the request's index, in
// [256, min(vocab, 32768)): ordinary ids in every vocab kvserve serves.
[[nodiscard]] std::vector<int32_t> TracePrompt(const TraceRequest& r,
                                               int64_t index, uint64_t seed,
                                               int32_t vocab_size);

}  // namespace kvserve::cli
