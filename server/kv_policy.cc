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
    if (policy.sinks() != 0 || policy.window() != 0) {
      return InvalidFieldError("kv_policy.type",
                               "sinks and window need type \"streaming\"");
    }
    return scheduler::KvWindow{};
  }
  if (type != "streaming") {
    return InvalidFieldError(
        "kv_policy.type", absl::StrCat("unknown policy \"", type.substr(0, 64),
                                       "\"; use \"full\" or \"streaming\""));
  }
  if (policy.sinks() < 0) {
    return InvalidFieldError(
        "kv_policy.sinks", absl::StrCat("must be >= 0, got ", policy.sinks()));
  }
  if (policy.window() < 1) {
    return InvalidFieldError(
        "kv_policy.window",
        absl::StrCat("streaming needs a window of >= 1 tokens, got ",
                     policy.window()));
  }
  return scheduler::KvWindow{.sinks = policy.sinks(),
                             .window = policy.window()};
}

absl::StatusOr<scheduler::KvWindow> ParseKvPolicyFlag(absl::string_view flag) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-policy \"", flag, "\": ", why,
                     " (use full or streaming:sinks=N,window=M)"));
  };
  v1::KvPolicy p;
  const std::pair<absl::string_view, absl::string_view> type_args =
      absl::StrSplit(flag, absl::MaxSplits(':', 1));
  p.set_type(std::string(type_args.first));
  if (p.type() == "streaming") p.set_sinks(4);
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
    } else {
      return bad(absl::StrCat("unknown key ", key_value.first));
    }
  }
  absl::StatusOr<scheduler::KvWindow> w = ToKvWindow(p);
  if (!w.ok()) return bad(w.status().message());
  return w;
}

}  // namespace kvserve::server
