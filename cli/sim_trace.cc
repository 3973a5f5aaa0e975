#include "cli/sim_trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>

#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {
namespace {

using json = nlohmann::json;

// Reads `key` of `obj` as a number in [lo, hi] into *out (left as it is when
// absent and not required).
absl::Status Field(const json& obj, const char* key, bool required, double lo,
                   double hi, double* out, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    if (!required) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: \"%s\" is required", where, key));
  }
  if (!it->is_number() || !(it->get<double>() >= lo) ||
      !(it->get<double>() <= hi)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: \"%s\" must be a number in [%g, %g], got %s",
                        where, key, lo, hi, it->dump()));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::StatusOr<TraceRequest> ParseLine(const std::string& line,
                                       const std::string& where) {
  const json obj = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!obj.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: not a JSON object", where));
  }
  constexpr double kMaxLen = 1 << 24;
  double arrival = 0, in = 0, out = 0, pid = -1, plen = 0;
  for (const auto& [key, ptr, req, lo, hi] :
       {std::tuple{"arrival", &arrival, true, 0.0, 1e9},
        std::tuple{"input_len", &in, true, 1.0, kMaxLen},
        std::tuple{"output_len", &out, true, 1.0, kMaxLen},
        std::tuple{"prefix_id", &pid, false, 0.0, 1e9},
        std::tuple{"prefix_len", &plen, false, 0.0, kMaxLen}}) {
    if (absl::Status s = Field(obj, key, req, lo, hi, ptr, where); !s.ok()) {
      return s;
    }
  }
  if (plen > in) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: \"prefix_len\" %g exceeds \"input_len\" %g", where, plen, in));
  }
  return TraceRequest{arrival, static_cast<int32_t>(in),
                      static_cast<int32_t>(out), static_cast<int32_t>(pid),
                      pid >= 0 ? static_cast<int32_t>(plen) : 0};
}

}  // namespace

absl::StatusOr<std::vector<TraceRequest>> ReadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrFormat("--trace %s: cannot open the file", path));
  }
  std::vector<TraceRequest> out;
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrFormat("--trace %s:%d", path, lineno);
    absl::StatusOr<TraceRequest> r = ParseLine(line, where);
    if (!r.ok()) return r.status();
    if (!out.empty() && r->arrival < out.back().arrival) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: \"arrival\" %g is before the previous line's %g",
                          where, r->arrival, out.back().arrival));
    }
    out.push_back(*r);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--trace %s: no requests", path));
  }
  return out;
}

std::vector<TraceRequest> SyntheticTrace(const SyntheticTraceSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::exponential_distribution<double> gap(
      spec.request_rate > 0 ? spec.request_rate : 1.0);
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto draw = [&](int32_t median, double sigma) {
    const double x = median * std::exp(sigma * normal(rng));
    return static_cast<int32_t>(std::max(1.0, std::round(x)));
  };
  std::vector<TraceRequest> out;
  out.reserve(spec.num_requests);
  double t = 0;
  for (int64_t i = 0; i < spec.num_requests; ++i) {
    if (spec.request_rate > 0 && i > 0) t += gap(rng);
    TraceRequest r;
    r.arrival = t;
    r.input_len = draw(spec.input_len, spec.input_sigma);
    r.output_len = draw(spec.output_len, spec.output_sigma);
    if (spec.num_prefixes > 0) {
      r.prefix_id = static_cast<int32_t>(i % spec.num_prefixes);
      r.prefix_len = spec.prefix_len;
      r.input_len = std::max(r.input_len, spec.prefix_len + 1);
    }
    r.input_len = std::min(r.input_len, spec.max_len - 1);
    r.prefix_len = std::min(r.prefix_len, r.input_len);
    r.output_len = std::min(r.output_len, spec.max_len - r.input_len);
    out.push_back(r);
  }
  return out;
}

std::vector<int32_t> TracePrompt(const TraceRequest& r, int64_t index,
                                 uint64_t seed, int32_t vocab_size) {
  constexpr int32_t kLow = 256;
  const int32_t high = std::max(kLow + 1, std::min(vocab_size, 32768));
  std::uniform_int_distribution<int32_t> id(kLow, high - 1);
  std::vector<int32_t> out;
  out.reserve(r.input_len);
  if (r.prefix_id >= 0) {
    std::mt19937_64 rng(seed ^ (0x5EEDULL + static_cast<uint64_t>(r.prefix_id) *
                                                0x9E3779B97F4A7C15ULL));
    for (int32_t i = 0; i < r.prefix_len; ++i) out.push_back(id(rng));
  }
  std::mt19937_64 rng(seed + 0xC0FFEEULL * static_cast<uint64_t>(index + 1));
  while (static_cast<int32_t>(out.size()) < r.input_len) out.push_back(id(rng));
  return out;
}

}  // namespace kvserve::cli
