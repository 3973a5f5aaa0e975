#include "server/grpc_service.h"

#include <atomic>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "common/tsan_annotations.h"
#include "server/proto_convert.h"
#include "server/served_model.h"
#include "server/status_mapping.h"
#include "server/wire_codec.h"
#include "spdlog/spdlog.h"

namespace kvserve::server {
namespace {

// What a GenerateReactor needs from the service.
struct GenerateDeps {
  engine::Engine* engine;
  ServerMetrics* metrics;
  const ServedModel* model;
  const RequestLimits* limits;
  const BearerAuth* auth;
  const TenantRef* single_tenant;
};

// One Generate call. Lifecycle:
//
//   ctor: parse + validate + Submit + Attach(sink)  (or Finish(error))
//   sink(delta) --StartWrite--> OnWriteDone --Ack--> sink(next delta) ...
//   sink(final delta) --StartWrite--> OnWriteDone --Finish(status)--> OnDone
//
// The StreamState protocol (one delta outstanding until Ack) serializes the
// sink, StartWrite, and Finish, so they need no lock even though the sink
// runs on the engine thread. When the call is dead (client cancel,
// deadline, failed write) the request is aborted and further deltas are
// acknowledged without writing until the final one, which Finishes the
// call; every request reaches a final delta (the engine finishes aborted
// requests as cancelled), so every call is finished and deleted.
class GenerateReactor final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer& request, const GenerateDeps& deps)
      : deps_(deps) {
    deps_.metrics->StreamOpened();
    stream_open_ = true;
    absl::StatusOr<engine::RequestSpec> spec = BuildSpec(context, request);
    absl::StatusOr<std::shared_ptr<engine::StreamState>> stream =
        spec.ok() ? deps_.engine->Submit(*std::move(spec)) : spec.status();
    if (!stream.ok()) {
      FinishCall(ToProtoFieldNames(stream.status()));
      return;
    }
    stream_ = *std::move(stream);
    // NOTE: last statement: from here on the sink may run on the engine
    // thread and, through Finish, lead to OnDone.
    stream_->Attach([this](const engine::StreamDelta& d) { OnDelta(d); });
  }

  // The callbacks acquire what StartWrite / Finish released (gRPC orders
  // them, inside the uninstrumented libgrpc; common/tsan_annotations.h).
  void OnWriteDone(bool ok) override {
    KV_TSAN_ACQUIRE(this);
    if (!ok) MarkDead();  // cancelled or broken; the client will not read on
    if (last_write_) {
      FinishCall(final_status_);
      return;
    }
    stream_->Ack();  // may call OnDelta on this thread
  }

  void OnCancel() override {
    KV_TSAN_ACQUIRE(this);
    MarkDead();
  }

  void OnDone() override {
    KV_TSAN_ACQUIRE(this);
    // Defensive: a call ends only after its final delta, so this is a no-op
    // unless the protocol above was broken.
    if (stream_ != nullptr && !stream_->Done()) {
      deps_.engine->Abort(stream_->id());
    }
    CloseStream();  // no-op: FinishCall closed it
    deps_.metrics->RpcDone("Generate", code_);
    delete this;
  }

 private:
  absl::StatusOr<engine::RequestSpec> BuildSpec(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer& request) {
    KV_ASSIGN_OR_RETURN(
        TenantRef tenant,
        AuthenticateGrpc(deps_.auth, *deps_.single_tenant, *context));
    v1::GenerateRequest req;
    KV_RETURN_IF_ERROR(ParseRequest(request, &req));
    request_id_ = req.request_id();
    std::vector<engine::RequestSpec> specs(1);
    KV_ASSIGN_OR_RETURN(
        specs[0],
        ToRequestSpec(req, *deps_.model,
                      absl::Uniform<uint64_t>(absl::BitGen()), *deps_.limits));
    KV_RETURN_IF_ERROR(
        ToProtoFieldNames(ApplyTenant(*tenant, *deps_.limits, &specs)));
    engine::RequestSpec spec = std::move(specs[0]);
    const auto deadline = context->deadline();
    if (deadline != std::chrono::system_clock::time_point::max()) {
      deadline_ = absl::FromChrono(deadline);
      spec.deadline = deadline_;
    }
    return spec;
  }

  // The sink. Runs on the engine thread (or this call's gRPC thread from
  // Attach/Ack); never blocks.
  void OnDelta(const engine::StreamDelta& delta) {
    if (delta.finished) {
      LogFinish(delta);
      final_status_ = FinishStatus(delta.finish_reason, delta.error,
                                   deps_.engine->draining());
    }
    if (dead_.load()) {
      if (delta.finished) {
        // The client is gone; the code only reaches our metrics.
        const bool timed_out =
            delta.finish_reason == engine::FinishReason::kDeadline ||
            absl::Now() >= deadline_;
        FinishCall(timed_out ? absl::DeadlineExceededError("deadline reached")
                             : absl::CancelledError("cancelled by the client"));
      } else {
        stream_->Ack();  // drain: the final delta follows the abort
      }
      return;
    }
    v1::GenerateResponse response;
    ToProto(delta, *deps_.model->tokenizer, &response);
    if (absl::Status s = SerializeResponse(response, &out_); !s.ok()) {
      final_status_ = std::move(s);
      MarkDead();
      if (delta.finished) {
        FinishCall(final_status_);
      } else {
        stream_->Ack();
      }
      return;
    }
    last_write_ = delta.finished;
    KV_TSAN_RELEASE(this);
    StartWrite(&out_);  // last use of `this` on this path
  }

  // Stops writing and aborts the request (idempotent, thread-safe).
  void MarkDead() {
    if (dead_.exchange(true)) return;
    if (stream_ != nullptr) deps_.engine->Abort(stream_->id());
  }

  void FinishCall(const absl::Status& status) {
    const grpc::Status s = ToGrpcStatus(status);
    code_ = s.error_code();
    // Before Finish: once the status is sent the client may open the next
    // stream, so the gauge counts the HTTP/2 limit's streams, never one more.
    CloseStream();
    KV_TSAN_RELEASE(this);
    Finish(s);
  }

  void CloseStream() {
    if (stream_open_) deps_.metrics->StreamClosed();
    stream_open_ = false;
  }

  void LogFinish(const engine::StreamDelta& d) {
    spdlog::debug(
        "generate {}{}: {} ({} prompt, {} completion, {:.3f} s)", stream_->id(),
        // Escaped: a client's id must not forge log lines or terminal codes.
        request_id_.empty() ? "" : " [" + absl::CHexEscape(request_id_) + "]",
        engine::FinishReasonName(d.finish_reason), d.usage.prompt_tokens,
        d.usage.completion_tokens, d.timings.total_seconds);
  }

  const GenerateDeps deps_;
  std::shared_ptr<engine::StreamState> stream_;
  std::string request_id_;
  absl::Time deadline_ = absl::InfiniteFuture();
  grpc::ByteBuffer out_;     // the one write in flight
  bool last_write_ = false;  // out_ carries the final delta
  absl::Status final_status_;
  std::atomic<bool> dead_{false};
  grpc::StatusCode code_ = grpc::StatusCode::OK;
  bool stream_open_ = false;  // counted in the open-streams gauge
};

}  // namespace

KvServeService::KvServeService(engine::Engine* engine, ServerMetrics* metrics,
                               RequestLimits limits, const BearerAuth* auth,
                               TenantRef single_tenant)
    : engine_(engine),
      metrics_(metrics),
      limits_(limits),
      model_(ServedModelOf(*engine)),
      auth_(auth),
      single_tenant_(single_tenant != nullptr
                         ? std::move(single_tenant)
                         : SingleTenant(TenantDefaults{})) {}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvServeService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  auto* reactor = new GenerateReactor(
      context, *request,
      {engine_, metrics_, &model_, &limits_, auth_, &single_tenant_});
  KV_TSAN_RELEASE(reactor);  // gRPC hands it to its callbacks' threads
  return reactor;
}

grpc::ServerUnaryReactor* KvServeService::Tokenize(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  auto run = [&]() -> absl::Status {
    KV_RETURN_IF_ERROR(
        AuthenticateGrpc(auth_, single_tenant_, *context).status());
    v1::TokenizeRequest req;
    KV_RETURN_IF_ERROR(ParseRequest(*request, &req));
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                        TokenizeText(req, model_, limits_));
    v1::TokenizeResponse out;
    out.mutable_token_ids()->Add(ids.begin(), ids.end());
    return SerializeResponse(out, response);
  };
  return FinishUnary(context, "Tokenize", run());
}

grpc::ServerUnaryReactor* KvServeService::Detokenize(
    grpc::CallbackServerContext* context, const v1::DetokenizeRequest* request,
    v1::DetokenizeResponse* response) {
  if (absl::Status s =
          AuthenticateGrpc(auth_, single_tenant_, *context).status();
      !s.ok()) {
    return FinishUnary(context, "Detokenize", s);
  }
  absl::StatusOr<std::string> text = DetokenizeIds(*request, model_);
  if (!text.ok()) return FinishUnary(context, "Detokenize", text.status());
  response->set_text(*std::move(text));
  return FinishUnary(context, "Detokenize", absl::OkStatus());
}

grpc::ServerUnaryReactor* KvServeService::GetModelInfo(
    grpc::CallbackServerContext* context,
    const v1::GetModelInfoRequest* /*request*/, v1::ModelInfo* response) {
  if (absl::Status s =
          AuthenticateGrpc(auth_, single_tenant_, *context).status();
      !s.ok()) {
    return FinishUnary(context, "GetModelInfo", s);
  }
  ToProto(engine_->model_info(), response);
  return FinishUnary(context, "GetModelInfo", absl::OkStatus());
}

grpc::ServerUnaryReactor* KvServeService::FinishUnary(
    grpc::CallbackServerContext* context, const char* method,
    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const grpc::Status s = ToGrpcStatus(status);
  metrics_->RpcDone(method, s.error_code());
  reactor->Finish(s);
  return reactor;
}

}  // namespace kvserve::server
