#include "server/status_mapping.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kvserve::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const int code = static_cast<int>(status.code());
  // NOTE: absl::StatusCode was defined to match grpc::StatusCode value for
  // value (0..16); anything else is not a code gRPC can carry.
  const grpc::StatusCode grpc_code =
      code > 0 && code <= static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)
          ? static_cast<grpc::StatusCode>(code)
          : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

absl::Status FinishStatus(engine::FinishReason reason, const std::string& error,
                          bool server_draining) {
  using engine::FinishReason;
  switch (reason) {
    case FinishReason::kStop:
    case FinishReason::kLength:
      return absl::OkStatus();
    case FinishReason::kDeadline:
      return absl::DeadlineExceededError(
          "request deadline reached before the generation finished");
    case FinishReason::kCancelled:
      if (server_draining) {
        return absl::UnavailableError(
            "server shutting down: request cancelled at the drain timeout");
      }
      return absl::CancelledError("request cancelled");
    case FinishReason::kError:
      return absl::InternalError(
          error.empty() ? "engine error" : absl::StrCat("engine: ", error));
    case FinishReason::kNone:
      break;
  }
  return absl::InternalError("engine finished the request without a reason");
}

}  // namespace kvserve::server
