#include "server/daemon.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/model_backend.h"
#include "engine/runner/platform.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "models/loader/model_resolver.h"
#include "models/loader/presets.h"
#include "spdlog/spdlog.h"

namespace kvserve::server {
namespace {

constexpr char kServiceName[] = "kvserve.v1.KvServe";
// After the engine drained, only unary calls and the last writes remain
// (gRPC and HTTP together get this long for them).
constexpr absl::Duration kShutdownGrace = absl::Seconds(5);

HttpServer::Options HttpOptions(const ServeOptions& o, const BearerAuth* auth,
                                TenantRef single) {
  HttpServer::Options h;
  h.host = o.host;
  h.port = o.metrics_port;
  h.threads = o.http_threads;
  h.max_connections = o.http_max_connections;
  h.tls = o.tls;
  h.auth = auth;
  h.single_tenant = std::move(single);
  h.auth_metrics = o.auth_metrics;
  h.allowed_hosts = o.allowed_hosts;
  h.max_request_bytes = o.max_request_bytes;
  return h;
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
  KV_RETURN_IF_ERROR(d->CheckSecurity(options));
  KV_ASSIGN_OR_RETURN(
      d->http_, HttpServer::Start(
                    HttpOptions(options, d->auth_.get(), d->single_tenant_),
                    d->registry_, [self] { return self->ready(); },
                    [self](HttpRoutes& routes) {
                      OpenAiApi::Mount(
                          routes, [self] { return self->openai_live_.load(); });
                    }));
  KV_RETURN_IF_ERROR(d->StartEngine(options));
  KV_RETURN_IF_ERROR(d->StartGrpc(options));
  d->ready_.store(true);
  if (options.stall_timeout > absl::ZeroDuration()) {
    d->watchdog_ = std::make_unique<StallWatchdog>(
        [self] { return self->engine_->Stats(); }, options.stall_timeout,
        [self](bool serving) {
          self->stalled_.store(!serving);
          grpc::HealthCheckServiceInterface* health =
              self->grpc_server_->GetHealthCheckService();
          health->SetServingStatus(serving);
          health->SetServingStatus(kServiceName, serving);
        });
  }
  return d;
}

// Everything that can refuse the configuration before a port is bound:
// the TLS files, the token file, and where --model resolves.
absl::Status Daemon::CheckSecurity(const ServeOptions& options) {
  KV_RETURN_IF_ERROR(CheckTlsOptions(options.tls));
  single_tenant_ = SingleTenant(options.tenant_defaults);
  if (!options.auth_token_file.empty()) {
    KV_ASSIGN_OR_RETURN(auth_, BearerAuth::FromFile(options.auth_token_file,
                                                    options.tenant_defaults));
    // NOTE: counts only; a token never reaches the log.
    spdlog::info("bearer-token authentication on ({} tokens, {} tenants)",
                 auth_->num_tokens(), auth_->num_tenants());
  } else if (options.auth_metrics) {
    return absl::InvalidArgumentError(
        "--auth-metrics: needs --auth-token-file");
  }
  models::ResolverOptions resolver = models::DefaultResolverOptions();
  if (!options.model_dirs.empty()) {
    resolver.models_dirs = options.model_dirs;
    resolver.hf_cache_dir.clear();
    resolver.confine_to_dirs = true;
  }
  absl::StatusOr<std::string> path =
      models::ResolveModelPath(options.model, resolver);
  // The simulated device serves a preset's architecture without its files.
  if (!path.ok() && engine::PlatformFor(options.engine.device).simulated() &&
      models::FindPreset(options.model) != nullptr) {
    model_path_ = options.model;
    return absl::OkStatus();
  }
  KV_ASSIGN_OR_RETURN(model_path_, std::move(path));
  return absl::OkStatus();
}

absl::Status Daemon::StartEngine(const ServeOptions& options) {
  spdlog::info("loading model {}", options.model);
  const absl::Time t0 = absl::Now();
  // The form of the weights follows the device: packed for the CPU, kept
  // for the GPU upload ("auto" without a GPU loads for the CPU).
  const engine::Device device = engine::ResolveDevice(options.engine.device);
  KV_ASSIGN_OR_RETURN(
      engine::LoadedModel model,
      engine::LoadModel(model_path_, device, options.rope_scale));
  const models::ModelConfig& c = model.config;
  spdlog::info(
      "model {} ({}) loaded for {} in {:.2f} s: {} layers, hidden {}, {} "
      "heads / {} KV heads, vocab {}, context {}{}",
      model.path, model.format, engine::DeviceName(device), SecondsSince(t0),
      c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.vocab_size,
      c.max_position,
      c.rope_scaling.type == models::RopeScalingType::kNone
          ? std::string()
          : absl::StrFormat(" (RoPE %s x%g of %d)",
                            models::RopeScalingTypeName(c.rope_scaling.type),
                            static_cast<double>(c.rope_scaling.factor),
                            c.rope_scaling.original_max_position));
  // "weights: 80.1 MiB in the file (Q4_K 45.0, Q6_K 35.0, F32 0.1 MiB),
  // 98.2 MiB packed": what each ggml type of the file costs, and what the
  // packed forms hold in memory.
  if (const std::string w = engine::DescribeWeights(model); !w.empty()) {
    spdlog::info("weights: {}", w);
  }
  KV_ASSIGN_OR_RETURN(
      engine_,
      engine::Engine::Create(options.engine, std::move(model), registry_));
  // One API call may start at most max_num_seqs sequences, and by default
  // ask for at most what they could run at once.
  RequestLimits limits = options.limits;
  const scheduler::SchedulerConfig& sc = options.engine.scheduler;
  limits.max_completions = sc.max_num_seqs;
  if (limits.max_request_tokens == 0) {
    limits.max_request_tokens =
        int64_t{sc.max_num_seqs} * engine_->model_info().max_context;
  }
  // A default window the engine would refuse in every request is refused
  // at start instead.
  if (const scheduler::KvWindow& w = limits.default_kv_window; w.enabled()) {
    scheduler::SchedulerConfig resolved = sc;
    resolved.max_model_len = engine_->model_info().max_context;
    if (absl::Status s = resolved.CheckKvWindow(w.sinks, w.window, w.budget);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-policy: ", s.message()));
    }
  }
  service_ = std::make_unique<KvServeService>(
      engine_.get(), metrics_.get(), limits, auth_.get(), single_tenant_);
  // The served name (--served-model-name, else --model as given) is what
  // /v1/models lists; its other names, --model and the file's own name are
  // accepted too.
  std::vector<std::string> names =
      absl::StrSplit(options.served_model_name, ',', absl::SkipEmpty());
  if (names.empty()) names.push_back(options.model);
  names.push_back(options.model);
  if (!engine_->model_info().name.empty()) {
    names.push_back(engine_->model_info().name);
  }
  std::string served = names.front();
  names.erase(names.begin());
  openai_ = std::make_unique<OpenAiApi>(engine_.get(), limits,
                                        std::move(served), std::move(names));
  openai_live_.store(openai_.get());
  return absl::OkStatus();
}

absl::Status Daemon::StartGrpc(const ServeOptions& options) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = HostPort(options.host, options.port);
  KV_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      GrpcServerCredentials(options.tls));
  builder.AddListeningPort(address, credentials, &grpc_port_);
  // Larger messages get RESOURCE_EXHAUSTED from gRPC before any parsing.
  if (options.max_request_bytes > 0) {
    builder.SetMaxReceiveMessageSize(static_cast<int>(
        std::min<int64_t>(options.max_request_bytes, INT32_MAX)));
  }
  if (options.max_concurrent_streams > 0) {
    // Per HTTP/2 connection; clients queue streams beyond it.
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options.max_concurrent_streams);
  }
  // NOTE: gRPC sets SO_REUSEPORT by default, which would let a second
  // daemon share the port silently; fail loudly instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(service_.get());
  reflection_v1_ = std::make_unique<ReflectionV1Service>(
      std::vector<std::string>{kServiceName, "grpc.health.v1.Health",
                               "grpc.reflection.v1.ServerReflection",
                               "grpc.reflection.v1alpha.ServerReflection"});
  builder.RegisterService(reflection_v1_.get());
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
  watchdog_.reset();  // no health change after this
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
    // What the finished requests left for the KV tiers, in what the drain
    // left of its budget (at least a second).
    const int64_t dropped = engine_->FlushKvTiers(
        std::max(t0 + drain_timeout, absl::Now() + absl::Seconds(1)));
    if (dropped > 0) {
      spdlog::warn("kv tiers: {} queued blocks not written at shutdown",
                   dropped);
    }
  }
  // One deadline for both front ends' last writes.
  const absl::Time close_by = absl::Now() + kShutdownGrace;
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(absl::ToChronoTime(close_by));
    grpc_server_->Wait();
  }
  if (http_ != nullptr) {
    http_->Stop(std::max(close_by - absl::Now(), absl::ZeroDuration()));
  }
  spdlog::info("shut down in {:.2f} s", SecondsSince(t0));
}

void Daemon::ReloadTokens() {
  if (auth_ == nullptr) {
    spdlog::info("SIGHUP: no --auth-token-file to reload");
    return;
  }
  const absl::Status s = auth_->Reload();
  metrics_->TokensReloaded(s.ok());
  if (!s.ok()) {
    spdlog::error("token file reload failed; the tokens in use stay: {}",
                  std::string(s.message()));
    return;
  }
  spdlog::info("token file reloaded: {} tokens, {} tenants",
               auth_->num_tokens(), auth_->num_tenants());
}

Daemon::~Daemon() { Shutdown(absl::ZeroDuration()); }

}  // namespace kvserve::server
