// Test helpers for end-to-end tests of the real `kvserve` binary: start it
// on free ports (--port 0 --metrics-port 0), read the bound ports from its
// "kvserve: listening grpc=HOST:PORT http=HOST:PORT" line, talk to it over
// gRPC and HTTP, signal it, and wait for its exit. Every wait is on a
// condition (output seen, pipe closed, metric reached) with a deadline;
// nothing sleeps for synchronization.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.grpc.pb.h"

extern char** environ;

namespace kvserve::server::testing {

inline constexpr char kBinary[] = KVSERVE_BINARY_DIR "/server/kvserve";
inline constexpr char kModel[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

// A running `kvserve` with stdout and stderr captured.
class ServerProcess {
 public:
  // Starts the binary with the default model on free ports plus `args`;
  // waits up to `timeout` for its listening line. Null (with a test
  // failure recorded) if it does not come up.
  static std::unique_ptr<ServerProcess> Start(
      const std::vector<std::string>& args,
      absl::Duration timeout = absl::Seconds(120)) {
    if (access(kModel, R_OK) != 0) {
      ADD_FAILURE() << kModel << " is missing (run deploy/setup.sh)";
      return nullptr;
    }
    std::unique_ptr<ServerProcess> p(new ServerProcess());
    std::vector<std::string> argv = {
        kBinary, "--model", kModel, "--port", "0", "--metrics-port", "0"};
    argv.insert(argv.end(), args.begin(), args.end());
    if (!p->Spawn(argv)) return nullptr;
    if (!p->WaitForListening(timeout)) {
      ADD_FAILURE() << "kvserve did not report its ports within " << timeout
                    << "; output:\n"
                    << p->Output();
      return nullptr;
    }
    return p;
  }

  ~ServerProcess() {
    if (!exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  std::string grpc_address() const {
    return absl::StrCat("127.0.0.1:", grpc_port_);
  }

  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel(grpc_address(),
                               grpc::InsecureChannelCredentials());
  }
  std::unique_ptr<v1::KvServe::Stub> Stub() const {
    return v1::KvServe::NewStub(Channel());
  }

  void Signal(int sig) { kill(pid_, sig); }

  // Everything the process wrote so far.
  std::string Output() const {
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }

  // True once `needle` appears in the output (false at the deadline).
  bool WaitForOutput(const std::string& needle, absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] {
      return eof_ || output_.find(needle) != std::string::npos;
    });
    return output_.find(needle) != std::string::npos;
  }

  // The exit status (WEXITSTATUS, or 128 + signal) once the process ends;
  // nullopt at the deadline.
  std::optional<int> WaitExit(absl::Duration timeout) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // The pipe closes when the process (its only writer) exits.
      if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                        [&] { return eof_; })) {
        return std::nullopt;
      }
    }
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return std::nullopt;
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  ServerProcess() = default;

  bool Spawn(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return false;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    std::vector<char*> argv;
    for (const std::string& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, args[0].c_str(), &actions, &attr,
                               argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      exited_ = true;
      ADD_FAILURE() << "cannot start " << args[0] << ": " << strerror(rc);
      return false;
    }
    reader_ = std::thread([this, fd = fds[0]] { ReadOutput(fd); });
    return true;
  }

  void ReadOutput(int fd) {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
      if (n <= 0) {
        eof_ = true;
        break;
      }
      output_.append(buf, static_cast<size_t>(n));
    }
    close(fd);
  }

  bool WaitForListening(absl::Duration timeout) {
    if (!WaitForOutput("kvserve: listening ", timeout)) return false;
    if (!WaitForOutput("\n", absl::Seconds(5))) return false;
    static const std::regex kLine(
        R"(kvserve: listening grpc=\S+:(\d+) http=\S+:(\d+))");
    std::smatch m;
    const std::string out = Output();
    if (!std::regex_search(out, m, kLine)) return false;
    grpc_port_ = std::stoi(m[1]);
    http_port_ = std::stoi(m[2]);
    return grpc_port_ > 0 && http_port_ > 0;
  }

  pid_t pid_ = -1;
  bool exited_ = false;
  int grpc_port_ = 0, http_port_ = 0;
  std::thread reader_;
  // NOTE: std::mutex, not absl::Mutex: Debian's abseil is not built with
  // ThreadSanitizer, so TSan cannot see absl::Mutex's ordering and reports
  // false races here; libstdc++'s mutex goes through intercepted pthreads.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string output_;  // guarded by mu_
  bool eof_ = false;    // guarded by mu_
};

// GET http://127.0.0.1:port/path: {status, body}; status -1 if unreachable
// (5 s to connect, then 10 s for the request and the whole response). One
// connection per call ("Connection: close"). Blocking: Beast's asynchronous
// operations on a private io_context, because only they honour the stream's
// timeouts.
inline std::pair<int, std::string> HttpGet(int port, const std::string& path) {
  namespace beast = boost::beast;
  namespace http = boost::beast::http;
  namespace net = boost::asio;
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  // Starts one operation (its handler stores the error in `ec`) and runs it
  // to completion: true when it succeeded.
  auto run = [&](auto start) {
    ioc.restart();
    start();
    ioc.run();
    return !ec;
  };
  const net::ip::tcp::endpoint endpoint(net::ip::address_v4::loopback(),
                                        static_cast<unsigned short>(port));
  stream.expires_after(std::chrono::seconds(5));
  if (!run([&] {
        stream.async_connect(endpoint, [&](beast::error_code e) { ec = e; });
      })) {
    return {-1, ""};
  }
  http::request<http::empty_body> request(http::verb::get, path, 11);
  request.set(http::field::host, absl::StrCat("127.0.0.1:", port));
  request.keep_alive(false);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  stream.expires_after(std::chrono::seconds(10));
  if (!run([&] {
        http::async_write(stream, request,
                          [&](beast::error_code e, size_t) { ec = e; });
      }) ||
      !run([&] {
        http::async_read(stream, buffer, parser,
                         [&](beast::error_code e, size_t) { ec = e; });
      })) {
    return {-1, ""};
  }
  stream.socket().shutdown(net::ip::tcp::socket::shutdown_both, ec);
  return {parser.get().result_int(), parser.get().body()};
}

// Prometheus text -> {"name{labels}": value} (samples only).
inline std::map<std::string, double> ParseMetrics(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    out[std::string(line.substr(0, space))] =
        std::strtod(std::string(line.substr(space + 1)).c_str(), nullptr);
  }
  return out;
}

// The current value of one series (NaN if absent or unreachable).
inline double Metric(int http_port, const std::string& series) {
  auto [status, body] = HttpGet(http_port, "/metrics");
  if (status != 200) return std::nan("");
  auto m = ParseMetrics(body);
  auto it = m.find(series);
  return it == m.end() ? std::nan("") : it->second;
}

// Re-scrapes /metrics until `pred` holds (true) or the deadline (false).
// Metrics change on the engine thread a step after the RPC that caused
// them, so tests wait for them rather than read them once.
inline bool WaitForMetrics(
    int http_port,
    const std::function<bool(const std::map<std::string, double>&)>& pred,
    absl::Duration timeout, std::string* last_scrape = nullptr) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    auto [status, body] = HttpGet(http_port, "/metrics");
    if (last_scrape != nullptr) *last_scrape = body;
    if (status == 200 && pred(ParseMetrics(body))) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));  // poll interval, not a sync
  }
}

// Value of `series` in a parsed scrape, 0 if absent.
inline double Get(const std::map<std::string, double>& m,
                  const std::string& series) {
  auto it = m.find(series);
  return it == m.end() ? 0.0 : it->second;
}

// Result of one streaming Generate call.
struct StreamResult {
  std::vector<int32_t> tokens;
  std::string text;
  int messages = 0;
  v1::GenerateResponse last;  // the last message received
  grpc::Status status;
};

inline StreamResult RunGenerate(v1::KvServe::Stub& stub,
                                const v1::GenerateRequest& request,
                                absl::Duration timeout = absl::Seconds(120)) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  StreamResult r;
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    r.tokens.insert(r.tokens.end(), msg.token_ids().begin(),
                    msg.token_ids().end());
    r.text += msg.text();
    ++r.messages;
    r.last = msg;
  }
  r.status = reader->Finish();
  return r;
}

// A greedy request: `max_tokens` tokens exactly (EOS ignored).
inline v1::GenerateRequest GreedyRequest(const std::string& prompt,
                                         int max_tokens) {
  v1::GenerateRequest req;
  req.set_prompt(prompt);
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  return req;
}

// A unary call to `method` with a raw request; {status, raw response}.
inline std::pair<grpc::Status, std::string> GenericUnary(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
    const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  auto call = stub.PrepareUnaryCall(&ctx, method, req, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&resp, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  std::string out;
  std::vector<grpc::Slice> slices;
  if (status.ok() && resp.Dump(&slices).ok()) {
    for (const auto& s : slices) {
      out.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return {status, out};
}

// Sends one raw message on a bidi-streaming `method`, reads one reply.
inline std::pair<grpc::Status, std::string> GenericBidiOnce(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
    const std::string& request) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  void* tag;
  bool ok = false;
  auto step = [&](intptr_t id) {
    return cq.Next(&tag, &ok) && tag == reinterpret_cast<void*>(id) && ok;
  };
  auto call = stub.PrepareCall(&ctx, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  std::string out;
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  if (step(1)) {
    call->Write(req, reinterpret_cast<void*>(2));
    if (step(2)) {
      call->Read(&resp, reinterpret_cast<void*>(3));
      if (step(3)) {
        std::vector<grpc::Slice> slices;
        if (resp.Dump(&slices).ok()) {
          for (const auto& s : slices) {
            out.append(reinterpret_cast<const char*>(s.begin()), s.size());
          }
        }
      }
    }
  }
  call->WritesDone(reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer rest;  // read to the end before Finish
  do {
    call->Read(&rest, reinterpret_cast<void*>(6));
  } while (cq.Next(&tag, &ok) && ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  while (cq.Next(&tag, &ok) && tag != reinterpret_cast<void*>(5)) {
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return {status, out};
}

}  // namespace kvserve::server::testing
