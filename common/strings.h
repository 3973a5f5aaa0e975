// String helpers shared by every layer.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace kvserve {

// abseil 20220623 here has its own absl::string_view (not std's): its maps'
// heterogeneous lookups, StrCat and SimpleAtoi take only that.
inline absl::string_view AbslView(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

}  // namespace kvserve
