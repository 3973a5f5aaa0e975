// A request's kv_policy (proto KvPolicy, the HTTP "kv_policy" object and
// the --kv-policy flag) as the scheduler's KvWindow. Owns the wire names
// and their first checks (type, signs); the engine checks the window
// against the model and the pool (Engine CheckKvWindow).
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvserve/v1/kvserve.pb.h"
#include "scheduler/request.h"

namespace kvserve::server {

// "full" (or an empty type): the whole cache, no KvWindow. "streaming":
// sinks >= 0 and window >= 1 tokens; "heavy_hitters" also a budget >= 1
// (and only it). INVALID_ARGUMENT naming kv_policy.type, .sinks, .window
// or .budget otherwise.
[[nodiscard]] absl::StatusOr<scheduler::KvWindow> ToKvWindow(
    const v1::KvPolicy& policy);

// The --kv-policy flag: "full", "streaming:sinks=N,window=M" or
// "heavy_hitters:sinks=N,window=M,budget=B" (sinks default 4).
// INVALID_ARGUMENT naming --kv-policy otherwise.
[[nodiscard]] absl::StatusOr<scheduler::KvWindow> ParseKvPolicyFlag(
    absl::string_view flag);

}  // namespace kvserve::server
