#include "cli/cli_serve.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cli/engine_flags.h"
#include "cli/kv_events_flags.h"
#include "cli/logging.h"
#include "common/cli_args.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "server/daemon.h"
#include "server/kv_policy.h"
#include "spdlog/spdlog.h"

namespace kvserve::cli {

using server::Daemon;
using server::HostPort;
using server::ServeOptions;

namespace {

// The engine's defaults: the flags below start from them and say them in
// --help, so there is one set.
const engine::EngineConfig& EngineDefaults() {
  static const engine::EngineConfig defaults;
  return defaults;
}
const scheduler::SchedulerConfig& SchedulerDefaults() {
  return EngineDefaults().scheduler;
}

struct ServeFlags {
  ServeOptions options;
  EngineFlags engine =
      EngineFlagsFrom(EngineDefaults(), ServeOptions().model,
                      std::string(engine::DeviceName(EngineDefaults().device)));
  int64_t port = 50051, metrics_port = 9090;
  int64_t long_prefill_token_threshold =
      SchedulerDefaults().long_prefill_token_threshold;
  int64_t max_queued_requests = EngineDefaults().max_queued_requests;
  int64_t max_model_len = EngineDefaults().max_model_len;
  int64_t http_threads = 2;
  int64_t http_max_connections = 4096;
  double rope_scale = 1;
  double drain_timeout = 30;
  double stall_timeout = 30;
  int64_t fault_step_delay_ms = 0;
  std::string kv_tier_faults = "none";
  bool kv_debug_invariants = false;
  std::string log_level = "info";
  // Security flags (docs/SECURITY.md).
  int64_t max_request_bytes = 4 << 20, max_prompt_tokens = 0;
  int64_t max_tokens_limit = 0, max_concurrent_streams = 0;
  int64_t max_request_tokens = 0, max_response_bytes = 64 << 20;
  std::string model_dirs, allowed_hosts;
  std::string kv_policy = "full";
  // Tenants (server/tenants.h).
  std::string priority_range = "-10..10";
  double priority_aging_seconds = SchedulerDefaults().priority_aging_seconds;
  int64_t thrash_preemption_limit = SchedulerDefaults().thrash_preemption_limit;
  double kv_high_watermark = SchedulerDefaults().admission_high_watermark;
  // Parsed into the engine's enum by FinishFlags.
  std::string scheduling_policy{
      scheduler::SchedulingPolicyName(SchedulerDefaults().policy)};
  KvEventsFlags kv_events;
  bool help = false;
};

// The scheduler's flags beyond the engine registry's.
void RegisterSchedulerFlags(ServeFlags* f, CliArgs* args) {
  args->Int("thrash-preemption-limit", &f->thrash_preemption_limit,
            absl::StrCat("a request preempted this many times in a row is "
                         "readmitted only when its whole remaining prefill "
                         "fits (default ",
                         f->thrash_preemption_limit, "; 0 = off)"),
            0, 1 << 20);
  args->Float("kv-high-watermark", &f->kv_high_watermark,
              absl::StrCat("stop admitting new requests above this fraction "
                           "of KV blocks in use (default ",
                           f->kv_high_watermark, "; 1 = never)"),
              0.001, 1);
  args->String("kv-policy", &f->kv_policy,
               "KV cache of a request that asks for none: full, or "
               "streaming:sinks=N,window=M (keep the first N and last M "
               "tokens, dropping whole blocks between), or "
               "heavy_hitters:sinks=N,window=M,budget=B (at most B tokens, "
               "dropping the blocks that drew the least attention; CPU "
               "only) (default full)");
  args->String("scheduling-policy", &f->scheduling_policy,
               absl::StrCat("fcfs, priority, or cache-aware (longest cached "
                            "prefix first among equal priorities) (default ",
                            f->scheduling_policy, ")"));
}

void RegisterSecurityFlags(ServeFlags* f, CliArgs* args) {
  ServeOptions& o = f->options;
  args->String("tls-cert", &o.tls.cert_file,
               "PEM certificate chain: serve gRPC and HTTP over TLS");
  args->String("tls-key", &o.tls.key_file, "PEM private key of --tls-cert");
  args->String("tls-client-ca", &o.tls.client_ca_file,
               "PEM CA bundle: require client certificates signed by it "
               "(mutual TLS)");
  args->String("auth-token-file", &o.auth_token_file,
               "file of bearer tokens, one per line ('#' comments): every "
               "gRPC call and /v1 request needs 'authorization: Bearer "
               "<token>'");
  args->Bool("auth-metrics", &o.auth_metrics,
             "/metrics needs a token too (default off; /health and /ready "
             "stay open)");
  args->Bytes("max-request-bytes", &f->max_request_bytes,
              "largest gRPC request message and HTTP body (default 4MiB; 0 = "
              "no limit)");
  args->Int("max-prompt-tokens", &f->max_prompt_tokens,
            "longest prompt in tokens (default 0 = the model's context)", 0,
            1 << 24);
  args->Int("max-tokens-limit", &f->max_tokens_limit,
            "largest max_tokens a request may ask for (default 0 = the "
            "model's context)",
            0, 1 << 24);
  args->Bool("special-tokens-in-chat-content",
             &o.limits.special_tokens_in_chat_content,
             "parse control tokens (e.g. <|im_end|>) typed in chat messages "
             "as control tokens (default off: plain text, so a message "
             "cannot forge a turn)");
  args->Int("max-concurrent-streams", &f->max_concurrent_streams,
            "gRPC streams per client connection; clients queue beyond it "
            "(default 0 = gRPC's default)",
            0, 1 << 20);
  args->Int("max-request-tokens", &f->max_request_tokens,
            "most tokens one API call may ask for, prompt + n x max_tokens "
            "over all its prompts (default 0 = --max-num-seqs x "
            "--max-model-len; a tenant's max_request_tokens may lower it)",
            0, int64_t{1} << 40);
  args->Bytes("max-response-bytes", &f->max_response_bytes,
              "largest non-streamed HTTP response a call may ask for, "
              "estimated from n, max_tokens and logprobs; larger calls must "
              "stream (default 64MiB; 0 = no limit)");
  args->String("priority-range", &f->priority_range,
               "LO..HI: client priorities are clamped to it (tenants whose "
               "token-file line sets no priority=, and every client without "
               "a token file; default -10..10)");
  args->Float("priority-aging-seconds", &f->priority_aging_seconds,
              absl::StrCat("seconds of waiting worth one priority level "
                           "(priority and cache-aware policies): no request "
                           "is passed by one arriving more than their "
                           "priority difference x this later (default ",
                           f->priority_aging_seconds, "; 0 = no aging)"),
              0, 3600);
  args->String("allowed-hosts", &f->allowed_hosts,
               "','-separated names the HTTP Host header may carry beside "
               "the bound address (loopback names when bound to loopback, "
               "IP literals when bound to 0.0.0.0); others get 403, which "
               "stops DNS rebinding. '*' = any Host (default none)");
  args->String("model-dirs", &f->model_dirs,
               "':'-separated directories; when set, --model resolves only "
               "inside them (no path outside, no symlink leading out)");
}

void RegisterFlags(ServeFlags* f, CliArgs* args) {
  ServeOptions& o = f->options;
  RegisterEngineFlags(&f->engine, kAllEngineFlags, args);
  args->String("served-model-name", &o.served_model_name,
               "the model's name in the OpenAI API, ','-separated aliases "
               "after the first (default: --model as given; --model and the "
               "file's own name are accepted too)");
  args->String("host", &o.host, "address to listen on (default 127.0.0.1)");
  args->Int("port", &f->port, "gRPC port (default 50051; 0 = pick a free one)",
            0, 65535);
  args->Int("metrics-port", &f->metrics_port,
            "HTTP port of /metrics, /health, /ready and the OpenAI-compatible "
            "API /v1/... (default 9090; 0 = pick a free one)",
            0, 65535);
  args->Int("http-port", &f->metrics_port,
            "alias of --metrics-port (one HTTP server serves both)", 0, 65535);
  args->Int("http-threads", &f->http_threads,
            "HTTP I/O threads; responses stream asynchronously, so a stream "
            "holds no thread (default 2)",
            1, 256);
  args->Int("http-max-connections", &f->http_max_connections,
            "open HTTP connections; beyond it, requests but /health, /ready "
            "and /metrics get 429 (default 4096)",
            1, 1 << 20);
  args->Int("long-prefill-token-threshold", &f->long_prefill_token_threshold,
            absl::StrCat("most prompt tokens one request computes per step, "
                         "so short requests join while a long prompt "
                         "prefills (default ",
                         f->long_prefill_token_threshold,
                         "; 0 = only the step budget)"),
            0, 1 << 20);
  args->Int("max-queued-requests", &f->max_queued_requests,
            absl::StrCat("waiting requests before RESOURCE_EXHAUSTED "
                         "(default ",
                         f->max_queued_requests, ")"),
            1, 1 << 24);
  args->Int("max-model-len", &f->max_model_len,
            "longest sequence, prompt + output (default 0 = the model's "
            "context)",
            0, 1 << 24);
  args->Float("rope-scale", &f->rope_scale,
              "linear RoPE scaling: positions divided by this factor, the "
              "model's context multiplied by it (default 1 = the model's own "
              "RoPE; refused for a model that already scales RoPE)",
              1, 64);
  args->Float("drain-timeout", &f->drain_timeout,
              "seconds in-flight requests may finish after SIGTERM/SIGINT "
              "(default 30)",
              0, 86400);
  args->Float("stall-timeout", &f->stall_timeout,
              "seconds with requests pending and no engine step completed "
              "before /ready says 503 and gRPC health NOT_SERVING (default "
              "30; 0 = never)",
              0, 86400);
  args->Int("fault-step-delay-ms", &f->fault_step_delay_ms,
            "fault injection for tests only: every engine step sleeps this "
            "many ms, like a stalled device (default 0 = off)",
            0, 3600 * 1000);
  args->Bool("kv-debug-invariants", &f->kv_debug_invariants,
             "for tests: check the KV cache's invariants after every step "
             "and abort on a broken one (always on in debug builds)");
  args->String("kv-tier-inject-faults", &f->kv_tier_faults,
               "fault injection for tests only: every KV disk tier write "
               "fails with enospc, erofs or eio, or every read with "
               "read-eio (default none)");
  args->String("log-level", &f->log_level,
               "trace, debug, info, warn, error, critical, off (default "
               "info)");
  RegisterSchedulerFlags(f, args);
  RegisterSecurityFlags(f, args);
  RegisterKvEventsFlags(&f->kv_events, args);
  args->Bool("help", &f->help, "show this help");
}

absl::Status FinishFlags(ServeFlags* f) {
  ServeOptions& o = f->options;
  o.port = static_cast<int>(f->port);
  o.metrics_port = static_cast<int>(f->metrics_port);
  o.rope_scale = static_cast<float>(f->rope_scale);
  o.http_threads = static_cast<int>(f->http_threads);
  o.http_max_connections = static_cast<int>(f->http_max_connections);
  o.stall_timeout = absl::Seconds(f->stall_timeout);
  o.max_request_bytes = f->max_request_bytes;
  o.max_concurrent_streams = static_cast<int>(f->max_concurrent_streams);
  o.limits.max_prompt_tokens = static_cast<int32_t>(f->max_prompt_tokens);
  o.limits.max_tokens = static_cast<int32_t>(f->max_tokens_limit);
  o.limits.max_request_tokens = f->max_request_tokens;
  o.limits.max_response_bytes = f->max_response_bytes;
  KV_ASSIGN_OR_RETURN(o.limits.default_kv_window,
                      server::ParseKvPolicyFlag(f->kv_policy));
  server::TenantLimits& tl = o.tenant_defaults.limits;
  KV_RETURN_IF_ERROR(
      server::ParsePriorityRange(f->priority_range, "--priority-range",
                                 &tl.priority_min, &tl.priority_max));
  for (absl::string_view h :
       absl::StrSplit(f->allowed_hosts, ',', absl::SkipEmpty())) {
    o.allowed_hosts.emplace_back(absl::StripAsciiWhitespace(h));
  }
  for (absl::string_view d :
       absl::StrSplit(f->model_dirs, ':', absl::SkipEmpty())) {
    o.model_dirs.emplace_back(d);
  }
  o.model = f->engine.model;
  engine::EngineConfig& e = o.engine;
  KV_RETURN_IF_ERROR(ApplyEngineFlags(f->engine, kAllEngineFlags, &e));
  const std::string model_name =
      o.served_model_name.empty()
          ? o.model
          : o.served_model_name.substr(0, o.served_model_name.find(','));
  KV_RETURN_IF_ERROR(ApplyKvEventsFlags(f->kv_events, model_name,
                                        f->metrics_port, &e.kv_events,
                                        &e.kv_events_private_scopes_model));
  scheduler::SchedulerConfig& s = e.scheduler;
  s.long_prefill_token_threshold =
      static_cast<int32_t>(f->long_prefill_token_threshold);
  s.thrash_preemption_limit = static_cast<int32_t>(f->thrash_preemption_limit);
  s.admission_high_watermark = f->kv_high_watermark;
  s.priority_aging_seconds = f->priority_aging_seconds;
  KV_ASSIGN_OR_RETURN(s.policy,
                      scheduler::ParseSchedulingPolicy(f->scheduling_policy));
  e.max_queued_requests = static_cast<int32_t>(f->max_queued_requests);
  e.max_model_len = static_cast<int32_t>(f->max_model_len);
  e.fault_step_delay = absl::Milliseconds(f->fault_step_delay_ms);
  e.debug_invariants = f->kv_debug_invariants;
  const std::string& faults = f->kv_tier_faults;
  if (faults == "enospc") {
    e.kv_tiers.inject_write_errno = ENOSPC;
  } else if (faults == "erofs") {
    e.kv_tiers.inject_write_errno = EROFS;
  } else if (faults == "eio") {
    e.kv_tiers.inject_write_errno = EIO;
  } else if (faults == "read-eio") {
    e.kv_tiers.inject_read_errno = EIO;
  } else if (faults != "none") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv-tier-inject-faults: '%s' must be none, enospc, erofs, eio or "
        "read-eio",
        faults));
  }
  static constexpr const char* kLevels[] = {"trace", "debug",    "info", "warn",
                                            "error", "critical", "off"};
  for (const char* level : kLevels) {
    if (f->log_level == level) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "--log-level: '%s' must be one of trace, debug, info, warn, error, "
      "critical, off",
      f->log_level));
}

// SIGTERM and SIGINT (drain) and SIGHUP (reload the token file), blocked in
// every thread and taken with sigwait on a dedicated one. Construct before
// any other thread starts, so that all threads inherit the blocked mask.
class SignalThread {
 public:
  SignalThread() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    thread_ = std::thread([this] { Run(); });
  }
  ~SignalThread() {
    if (!logging_ready_.HasBeenNotified()) logging_ready_.Notify();
    stopping_.store(true);
    // NOLINTNEXTLINE(bugprone-bad-signal-to-kill-thread): wakes sigwait.
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }
  // Notified at the first SIGTERM/SIGINT.
  absl::Notification& requested() { return requested_; }
  // What SIGHUP runs (on this thread) from now on; null: nothing.
  void OnReload(std::function<void()> f) {
    absl::MutexLock lock(&mu_);
    reload_ = std::move(f);
  }
  // The logger is set up: the thread may log (it waits for this first, so
  // its logging is ordered after the set-up). Call once.
  void LoggingReady() { logging_ready_.Notify(); }

 private:
  void Run() {
    for (;;) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0 || stopping_.load()) return;
      logging_ready_.WaitForNotification();
      if (stopping_.load()) return;
      if (sig == SIGHUP) {
        absl::MutexLock lock(&mu_);
        if (reload_) {
          spdlog::info("SIGHUP: reloading the token file");
          reload_();
        }
        continue;
      }
      if (requested_.HasBeenNotified()) {
        spdlog::warn("{}: already draining", strsignal(sig));
        continue;
      }
      spdlog::info("{}: draining", strsignal(sig));
      requested_.Notify();
    }
  }

  sigset_t set_;
  std::atomic<bool> stopping_{false};
  absl::Notification requested_;
  absl::Notification logging_ready_;
  absl::Mutex mu_;
  std::function<void()> reload_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

int Serve(const ServeFlags& f, SignalThread& signals) {
  if (f.engine.threads > 0) SetNumThreads(static_cast<int>(f.engine.threads));
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(f.options);
  if (!daemon.ok()) {
    spdlog::error("start-up failed: {}", daemon.status().ToString());
    return 1;
  }
  // NOTE: a plain stderr line, whatever the log level: tests and scripts
  // read the bound ports from it.
  std::fprintf(stderr, "kvserve: listening grpc=%s http=%s\n",
               HostPort(f.options.host, (*daemon)->grpc_port()).c_str(),
               HostPort(f.options.host, (*daemon)->http_port()).c_str());
  std::fflush(stderr);
  Daemon* d = daemon->get();
  signals.OnReload([d] { d->ReloadTokens(); });
  signals.requested().WaitForNotification();
  signals.OnReload(nullptr);
  (*daemon)->Shutdown(absl::Seconds(f.drain_timeout));
  return 0;
}

}  // namespace

int RunServeCommand(int argc, const char* const* argv) {
  // Before any thread exists (the daemon's threads inherit the mask).
  SignalThread signals;
  ServeFlags f;
  CliArgs args("serve");
  RegisterFlags(&f, &args);
  const int first = argc > 1 && std::strcmp(argv[1], "serve") == 0 ? 2 : 1;
  absl::Status s = args.Parse(argc, argv, first);
  if (f.help) {
    std::fputs(args.Usage().c_str(), stdout);
    return 0;
  }
  if (s.ok()) s = FinishFlags(&f);
  if (!s.ok()) {
    std::fprintf(stderr, "kvserve: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  SetUpLogging(f.log_level);
  signals.LoggingReady();
  return Serve(f, signals);
}

}  // namespace kvserve::cli
