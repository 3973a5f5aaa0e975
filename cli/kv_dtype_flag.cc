#include "cli/kv_dtype_flag.h"

#include "absl/strings/str_cat.h"

namespace kvserve::cli {

absl::StatusOr<std::optional<kvcache::KvDtype>> ParseKvCacheDtypeFlag(
    std::string_view value) {
  if (value == "auto") return std::nullopt;
  absl::StatusOr<kvcache::KvDtype> d = kvcache::ParseKvDtype(value);
  if (!d.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-cache-dtype: ", d.status().message()));
  }
  return *d;
}

}  // namespace kvserve::cli
