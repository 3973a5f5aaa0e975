// The --kv-cache-dtype flag of `kvserve serve` and `kvserve generate`:
// "auto" (the backend's default) or a kvcache::KvDtype name.
#pragma once

#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "kvcache/kv_sizing.h"

namespace kvserve::cli {

// What "auto" picks, for the flag's help (engine::DefaultCpuKvDtype and the
// CUDA backend's default).
inline constexpr char kKvDtypeAutoHelp[] =
    "auto (CPU int8 where head_dim is a multiple of 64, else fp16; CUDA bf16)";

// nullopt for "auto"; the dtype for a known name; otherwise InvalidArgument
// naming the flag and the accepted names.
[[nodiscard]] absl::StatusOr<std::optional<kvcache::KvDtype>>
ParseKvCacheDtypeFlag(std::string_view value);

}  // namespace kvserve::cli
