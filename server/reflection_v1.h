// gRPC server reflection v1 (grpc.reflection.v1.ServerReflection), beside
// the v1alpha service libgrpc++_reflection registers: current clients
// (grpcurl, Postman, Kreya) try v1 first. Answers from the process's
// generated descriptor pool: the services it is given, files by name, by
// symbol and by extension, and extension numbers. Stateless; no auth, as
// v1alpha (it describes the API, nothing more).
#pragma once

#include <string>
#include <vector>

#include "grpc/reflection/v1/reflection.grpc.pb.h"

namespace kvserve::server {

class ReflectionV1Service final
    : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the full names list_services answers with.
  explicit ReflectionV1Service(std::vector<std::string> services)
      : services_(std::move(services)) {}

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

  // The answer to one request (public for tests).
  [[nodiscard]] grpc::reflection::v1::ServerReflectionResponse Answer(
      const grpc::reflection::v1::ServerReflectionRequest& request) const;

 private:
  const std::vector<std::string> services_;
};

}  // namespace kvserve::server
