#include "server/daemon.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/loaded_model.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "spdlog/spdlog.h"

namespace kvserve::server {
namespace {

constexpr char kServiceName[] = "kvserve.v1.KvServe";
// After the engine drained, only unary calls and the last writes remain.
constexpr absl::Duration kGrpcShutdownGrace = absl::Seconds(5);

double SecondsSince(absl::Time t) {
  return absl::ToDoubleSeconds(absl::Now() - t);
}

}  // namespace

std::string HostPort(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host[0] != '[';
  return v6 ? absl::StrCat("[", host, "]:", port)
            : absl::StrCat(host, ":", port);
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(
    const ServeOptions& options) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->registry_ = std::make_shared<prometheus::Registry>();
  d->metrics_ = std::make_unique<ServerMetrics>(*d->registry_);
  Daemon* self = d.get();
  KV_ASSIGN_OR_RETURN(
      d->http_,
      HttpServer::Start(
          {options.host, options.metrics_port, options.http_threads},
          d->registry_, [self] { return self->ready(); },
          [self](httplib::Server* server) {
            OpenAiApi::Mount(server,
                             [self] { return self->openai_live_.load(); });
          }));
  KV_RETURN_IF_ERROR(d->StartEngine(options));
  KV_RETURN_IF_ERROR(d->StartGrpc(options));
  d->ready_.store(true);
  return d;
}

absl::Status Daemon::StartEngine(const ServeOptions& options) {
  spdlog::info("loading model {}", options.model);
  const absl::Time t0 = absl::Now();
  KV_ASSIGN_OR_RETURN(engine::LoadedModel model,
                      engine::LoadModel(options.model));
  const models::ModelConfig& c = model.config;
  spdlog::info(
      "model {} ({}) loaded in {:.2f} s: {} layers, hidden {}, {} heads / {} "
      "KV heads, vocab {}, {:.1f} MiB of packed weights",
      model.path, model.format, SecondsSince(t0), c.num_layers,
      c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size,
      model.model->weight_bytes() / 1048576.0);
  KV_ASSIGN_OR_RETURN(
      engine_,
      engine::Engine::Create(options.engine, std::move(model), registry_));
  service_ = std::make_unique<KvServeService>(engine_.get(), metrics_.get(),
                                              options.limits);
  const std::string& name = engine_->model_info().name;
  openai_ = std::make_unique<OpenAiApi>(engine_.get(), options.limits,
                                        name.empty() ? options.model : name,
                                        options.model);
  openai_live_.store(openai_.get());
  return absl::OkStatus();
}

absl::Status Daemon::StartGrpc(const ServeOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = HostPort(options.host, options.port);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &grpc_port_);
  // NOTE: gRPC sets SO_REUSEPORT by default, which would let a second
  // daemon share the port silently; fail loudly instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service_.get());
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || grpc_port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--port: cannot listen on ", address));
  }
  grpc::HealthCheckServiceInterface* health =
      grpc_server_->GetHealthCheckService();
  health->SetServingStatus(true);
  health->SetServingStatus(kServiceName, true);
  return absl::OkStatus();
}

void Daemon::Shutdown(absl::Duration drain_timeout) {
  if (shut_down_) return;
  shut_down_ = true;
  ready_.store(false);
  // Refuse new work before anything is logged or waited for.
  if (engine_ != nullptr) engine_->BeginDrain();
  const absl::Time t0 = absl::Now();
  if (grpc_server_ != nullptr) {
    // Every service NOT_SERVING, and it stays so.
    grpc_server_->GetHealthCheckService()->Shutdown();
  }
  if (engine_ != nullptr) {
    const engine::EngineStats s = engine_->Stats();
    spdlog::info("draining: {} running, {} waiting, timeout {}", s.running,
                 s.waiting, absl::FormatDuration(drain_timeout));
    engine_->Drain(drain_timeout);
  }
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(
        absl::ToChronoTime(absl::Now() + kGrpcShutdownGrace));
    grpc_server_->Wait();
  }
  if (http_ != nullptr) http_->Stop();
  spdlog::info("shut down in {:.2f} s", SecondsSince(t0));
}

Daemon::~Daemon() { Shutdown(absl::ZeroDuration()); }

}  // namespace kvserve::server
