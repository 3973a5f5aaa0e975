// The kvserve.v1.KvServe gRPC service over the callback API. Owns request
// parsing and validation on the gRPC side, posting to the engine, and the
// Generate stream's reactor: it Attach()es a sink to the request's
// StreamState, starts one write per delta the sink receives, Ack()s when
// the write is done, and Abort()s the request when the client goes away.
// Reactions never block and hold no lock across calls into the engine.
// Does not own the engine, the gRPC server, health, or reflection
// (daemon.h wires those).
//
// Generate and Tokenize are registered as raw (ByteBuffer) methods so that
// a string field with invalid UTF-8 is answered with INVALID_ARGUMENT
// naming the field (see wire_codec.h) instead of gRPC's INTERNAL.
#pragma once

#include "engine/engine.h"
#include "grpcpp/grpcpp.h"
#include "kvserve/v1/kvserve.grpc.pb.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/request_validation.h"

namespace kvserve::server {

using KvServeBase = v1::KvServe::WithRawCallbackMethod_Generate<
    v1::KvServe::WithRawCallbackMethod_Tokenize<
        v1::KvServe::WithCallbackMethod_Detokenize<
            v1::KvServe::WithCallbackMethod_GetModelInfo<
                v1::KvServe::Service>>>>;

class KvServeService final : public KvServeBase {
 public:
  // `engine`, `metrics` and `auth` are not owned and must outlive the gRPC
  // server this service is registered with (shut the server down first).
  // With `auth`, every call needs an accepted bearer token (UNAUTHENTICATED)
  // and runs as its tenant; without, as `single_tenant` (null: a default
  // single tenant).
  KvServeService(engine::Engine* engine, ServerMetrics* metrics,
                 RequestLimits limits = {}, const BearerAuth* auth = nullptr,
                 TenantRef single_tenant = nullptr);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(
      grpc::CallbackServerContext* context,
      const v1::DetokenizeRequest* request,
      v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;

 private:
  grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                        const char* method,
                                        const absl::Status& status);

  engine::Engine* const engine_;
  ServerMetrics* const metrics_;
  const RequestLimits limits_;
  const ServedModel model_;
  const BearerAuth* const auth_;
  const TenantRef single_tenant_;
};

}  // namespace kvserve::server
