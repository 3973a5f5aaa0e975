// The single mapping from kvserve's errors to gRPC statuses. Owns the
// absl::Status -> grpc::Status conversion and the ending status of a
// Generate stream by its FinishReason. Does not own the errors themselves
// (validation and the engine produce them).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/request_spec.h"
#include "grpcpp/support/status.h"

namespace kvserve::server {

// Same code (absl's codes are gRPC's), same message. Codes outside gRPC's
// range become UNKNOWN.
[[nodiscard]] grpc::Status ToGrpcStatus(const absl::Status& status);

// How a Generate call ends after its last message:
//   kStop, kLength -> OK
//   kDeadline      -> DEADLINE_EXCEEDED
//   kCancelled     -> UNAVAILABLE when the server is draining (the engine
//                     cancelled it at the drain timeout), else CANCELLED
//   kError         -> INTERNAL with `error`
//   kNone          -> INTERNAL (an engine bug: finished without a reason)
[[nodiscard]] absl::Status FinishStatus(engine::FinishReason reason,
                                        const std::string& error,
                                        bool server_draining);

}  // namespace kvserve::server
