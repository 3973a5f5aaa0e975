// ToGrpcStatus keeps code and message; FinishStatus maps each finish
// reason to the Generate call's ending status.
#include "server/status_mapping.h"

#include "gtest/gtest.h"

namespace kvserve::server {
namespace {

TEST(StatusMappingTest, KeepsCodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const struct {
    absl::Status in;
    grpc::StatusCode out;
  } cases[] = {
      {absl::InvalidArgumentError("f: bad"),
       grpc::StatusCode::INVALID_ARGUMENT},
      {absl::ResourceExhaustedError("q"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::OutOfRangeError("big"), grpc::StatusCode::OUT_OF_RANGE},
      {absl::UnavailableError("drain"), grpc::StatusCode::UNAVAILABLE},
      {absl::CancelledError("c"), grpc::StatusCode::CANCELLED},
      {absl::DeadlineExceededError("d"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::InternalError("i"), grpc::StatusCode::INTERNAL},
      {absl::FailedPreconditionError("p"),
       grpc::StatusCode::FAILED_PRECONDITION},
      {absl::NotFoundError("n"), grpc::StatusCode::NOT_FOUND},
      {absl::UnauthenticatedError("u"), grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& c : cases) {
    const grpc::Status s = ToGrpcStatus(c.in);
    EXPECT_EQ(s.error_code(), c.out) << c.in;
    EXPECT_EQ(s.error_message(), std::string(c.in.message()));
  }
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "x"))
                .error_code(),
            grpc::StatusCode::UNKNOWN);
}

TEST(StatusMappingTest, FinishReasons) {
  using engine::FinishReason;
  EXPECT_TRUE(FinishStatus(FinishReason::kStop, "", false).ok());
  EXPECT_TRUE(FinishStatus(FinishReason::kLength, "", true).ok());
  EXPECT_EQ(FinishStatus(FinishReason::kDeadline, "", false).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(FinishStatus(FinishReason::kCancelled, "", false).code(),
            absl::StatusCode::kCancelled);
  EXPECT_EQ(FinishStatus(FinishReason::kCancelled, "", true).code(),
            absl::StatusCode::kUnavailable);
  const absl::Status err =
      FinishStatus(FinishReason::kError, "nan logits", false);
  EXPECT_EQ(err.code(), absl::StatusCode::kInternal);
  EXPECT_NE(err.message().find("nan logits"), absl::string_view::npos);
  EXPECT_EQ(FinishStatus(FinishReason::kNone, "", false).code(),
            absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace kvserve::server
