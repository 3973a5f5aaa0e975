#include "server/kv_policy.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/field_error.h"

namespace kvserve::server {

absl::StatusOr<scheduler::KvWindow> ToKvWindow(const v1::KvPolicy& policy) {
  const std::string& type = policy.type();
  if (type.empty() || type == "full") {
    if (policy.sinks() != 0 || policy.window() != 0 || policy.budget() != 0) {
      return InvalidFieldError(
          "kv_policy.type",
          "sinks, window and budget need type \"streaming\" or "
          "\"heavy_hitters\"");
    }
    return scheduler::KvWindow{};
  }
  const bool hh = type == "heavy_hitters";
  if (type != "streaming" && !hh) {
    return InvalidFieldError(
        "kv_policy.type",
        absl::StrCat("unknown policy \"", type.substr(0, 64),
                     "\"; use \"full\", \"streaming\" or \"heavy_hitters\""));
  }
  if (hh != (policy.budget() != 0)) {
    return InvalidFieldError(
        "kv_policy.budget",
        hh ? absl::StrCat("heavy_hitters needs a budget of >= 1 tokens, got ",
                          policy.budget())
           : std::string("budget is for heavy_hitters; streaming holds the "
                         "sinks and the window"));
  }
  if (policy.sinks() < 0) {
    return InvalidFieldError(
        "kv_policy.sinks", absl::StrCat("must be >= 0, got ", policy.sinks()));
  }
  if (policy.window() < 1) {
    return InvalidFieldError(
        "kv_policy.window",
        absl::StrCat(type, " needs a window of >= 1 tokens, got ",
                     policy.window()));
  }
  return scheduler::KvWindow{.sinks = policy.sinks(),
                             .window = policy.window(),
                             .budget = policy.budget()};
}

absl::StatusOr<scheduler::KvWindow> ParseKvPolicyFlag(absl::string_view flag) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-policy \"", flag, "\": ", why,
                     " (use full, streaming:sinks=N,window=M or "
                     "heavy_hitters:sinks=N,window=M,budget=B)"));
  };
  v1::KvPolicy p;
  const std::pair<absl::string_view, absl::string_view> type_args =
      absl::StrSplit(flag, absl::MaxSplits(':', 1));
  p.set_type(std::string(type_args.first));
  if (p.type() == "streaming" || p.type() == "heavy_hitters") p.set_sinks(4);
  for (absl::string_view kv :
       absl::StrSplit(type_args.second, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> key_value =
        absl::StrSplit(kv, absl::MaxSplits('=', 1));
    int32_t v = 0;
    if (!absl::SimpleAtoi(key_value.second, &v)) {
      return bad(absl::StrCat(key_value.first, " is not a number"));
    }
    if (key_value.first == "sinks") {
      p.set_sinks(v);
    } else if (key_value.first == "window") {
      p.set_window(v);
    } else if (key_value.first == "budget") {
      p.set_budget(v);
    } else {
      return bad(absl::StrCat("unknown key ", key_value.first));
    }
  }
  absl::StatusOr<scheduler::KvWindow> w = ToKvWindow(p);
  if (!w.ok()) return bad(w.status().message());
  return w;
}

}  // namespace kvserve::server
