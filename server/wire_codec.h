// Request parsing and response serialization for the methods the service
// registers as raw (grpc::ByteBuffer) callbacks. Owns one thing: protobuf
// refuses a proto3 string field holding invalid UTF-8 without saying which
// field, and gRPC would answer that with INTERNAL; parsing here answers
// INVALID_ARGUMENT naming the field instead ("sampling.stop[1]: invalid
// UTF-8"). Does not validate values (request_validation.h does).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace kvserve::server {

// Parses `buffer` into `msg`. INVALID_ARGUMENT naming the first string field
// with invalid UTF-8, or saying the bytes are not a `msg` at all.
[[nodiscard]] absl::Status ParseRequest(const grpc::ByteBuffer& buffer,
                                        google::protobuf::Message* msg);

// Serializes `msg` into `out` (replacing its contents). INTERNAL if
// protobuf refuses.
[[nodiscard]] absl::Status SerializeResponse(
    const google::protobuf::Message& msg, grpc::ByteBuffer* out);

// The path ("chat.messages[2].content") of the first string field of
// `wire`, read as a `descriptor` message with every string taken as bytes,
// that is not valid UTF-8; "" when there is none or `wire` does not parse
// even leniently. Only the error path of ParseRequest calls this.
[[nodiscard]] std::string FindInvalidUtf8Field(
    std::string_view wire, const google::protobuf::Descriptor* descriptor);

}  // namespace kvserve::server
