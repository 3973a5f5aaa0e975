#include "kvevents/publisher.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace kvserve::kvevents {

struct Publisher::Sockets {
  void* ctx = nullptr;
  void* pub = nullptr;
  void* replay = nullptr;
  int wake_fd = -1;
  ~Sockets() {
    if (pub != nullptr) zmq_close(pub);
    if (replay != nullptr) zmq_close(replay);
    if (ctx != nullptr) zmq_ctx_term(ctx);
    if (wake_fd >= 0) close(wake_fd);
  }
};

namespace {

constexpr int kLingerMs = 1000;
constexpr size_t kZ85KeyChars = 40;

std::string BigEndian(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i) {
    s[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return s;
}

// Sends `frames` as one message; false on a ZMQ error.
bool SendFrames(void* socket, const std::vector<std::string>& frames) {
  for (size_t i = 0; i < frames.size(); ++i) {
    const int flags = ZMQ_DONTWAIT | (i + 1 < frames.size() ? ZMQ_SNDMORE : 0);
    if (zmq_send(socket, frames[i].data(), frames[i].size(), flags) < 0) {
      return false;
    }
  }
  return true;
}

// Receives one whole message (every frame) without waiting.
bool RecvFrames(void* socket, std::vector<std::string>* frames) {
  frames->clear();
  while (true) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&msg);
      return false;
    }
    frames->emplace_back(static_cast<const char*>(zmq_msg_data(&msg)),
                         zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg) != 0;
    zmq_msg_close(&msg);
    if (!more) return true;
  }
}

absl::Status SetInt(void* socket, int option, int value, const char* what) {
  if (zmq_setsockopt(socket, option, &value, sizeof(value)) != 0) {
    return absl::InternalError(
        absl::StrCat("kv events: setting ", what, ": ", zmq_strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status MakeCurveServer(void* socket, const std::string& secret) {
  if (zmq_setsockopt(socket, ZMQ_CURVE_SECRETKEY, secret.data(),
                     secret.size()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-events-curve-secret-key-file: not a Z85 CURVE secret key: ",
        zmq_strerror(errno)));
  }
  return SetInt(socket, ZMQ_CURVE_SERVER, 1, "ZMQ_CURVE_SERVER");
}

// Opens `type` on `endpoint`: bound or connected as `bind` says.
absl::StatusOr<void*> Open(void* ctx, int type, const std::string& endpoint,
                           bool bind, const PublisherOptions& o,
                           const char* flag) {
  void* s = zmq_socket(ctx, type);
  if (s == nullptr) {
    return absl::InternalError(
        absl::StrCat("kv events: zmq_socket: ", zmq_strerror(errno)));
  }
  absl::Status st = SetInt(s, ZMQ_LINGER, kLingerMs, "ZMQ_LINGER");
  if (st.ok() && type == ZMQ_PUB) st = SetInt(s, ZMQ_SNDHWM, o.hwm, "HWM");
  // A replay sends the whole buffer at once; a ROUTER drops what passes its
  // high-water mark (1000 by default), so room for all of it.
  if (st.ok() && type == ZMQ_ROUTER) {
    st = SetInt(s, ZMQ_SNDHWM, std::max(1000, o.buffer_batches + 2),
                "replay HWM");
  }
  if (st.ok() && !o.curve_secret_key.empty()) {
    st = MakeCurveServer(s, o.curve_secret_key);
  }
  if (st.ok()) {
    const int rc =
        bind ? zmq_bind(s, endpoint.c_str()) : zmq_connect(s, endpoint.c_str());
    if (rc != 0) {
      st = absl::InvalidArgumentError(
          absl::StrCat(flag, " '", endpoint, "': cannot ",
                       bind ? "bind" : "connect", ": ", zmq_strerror(errno)));
    }
  }
  if (!st.ok()) {
    zmq_close(s);
    return st;
  }
  return s;
}

absl::Status CheckOptions(const PublisherOptions& o) {
  if (o.queue_batches < 1 || o.buffer_batches < 0 || o.hwm < 0) {
    return absl::InvalidArgumentError(
        "kv events: queue_batches must be >= 1, buffer_batches and hwm >= 0");
  }
  if (!o.curve_secret_key.empty()) {
    if (o.curve_secret_key.size() != kZ85KeyChars) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-events-curve-secret-key-file: a Z85 CURVE secret key is ",
          kZ85KeyChars, " characters, got ", o.curve_secret_key.size()));
    }
    if (zmq_has("curve") == 0) {
      return absl::FailedPreconditionError(
          "--kv-events-curve-secret-key-file: this libzmq has no CURVE");
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool Publisher::Binds(const std::string& endpoint) {
  return absl::StrContains(endpoint, "*") ||
         absl::StrContains(endpoint, "::") ||
         absl::StartsWith(endpoint, "ipc://") ||
         absl::StartsWith(endpoint, "inproc://");
}

absl::StatusOr<std::unique_ptr<Publisher>> Publisher::Create(
    PublisherOptions options) {
  if (absl::Status st = CheckOptions(options); !st.ok()) return st;
  auto sockets = std::make_unique<Sockets>();
  sockets->ctx = zmq_ctx_new();
  sockets->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (sockets->ctx == nullptr || sockets->wake_fd < 0) {
    return absl::InternalError(absl::StrCat(
        "kv events: cannot create a ZMQ context: ", std::strerror(errno)));
  }
  absl::StatusOr<void*> pub =
      Open(sockets->ctx, ZMQ_PUB, options.endpoint, Binds(options.endpoint),
           options, "--kv-events-endpoint");
  if (!pub.ok()) return pub.status();
  sockets->pub = *pub;
  if (!options.replay_endpoint.empty()) {
    absl::StatusOr<void*> replay =
        Open(sockets->ctx, ZMQ_ROUTER, options.replay_endpoint, true, options,
             "--kv-events-replay-endpoint");
    if (!replay.ok()) return replay.status();
    sockets->replay = *replay;
  }
  return std::unique_ptr<Publisher>(
      new Publisher(std::move(options), std::move(sockets)));
}

Publisher::Publisher(PublisherOptions options, std::unique_ptr<Sockets> sockets)
    : options_(std::move(options)), sockets_(std::move(sockets)) {
  thread_ = std::thread([this] { Run(); });
}

Publisher::~Publisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  Wake();
  thread_.join();
}

void Publisher::Wake() const {
  const uint64_t one = 1;
  (void)!write(sockets_->wake_fd, &one, sizeof(one));
}

bool Publisher::Publish(EventBatch batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int32_t>(queue_.size()) >= options_.queue_batches) {
      ++stats_.dropped_batches;
      stats_.dropped_events += static_cast<int64_t>(batch.events.size());
      return false;
    }
    queue_.push_back(std::move(batch));
  }
  Wake();
  return true;
}

PublisherStats Publisher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  PublisherStats s = stats_;
  s.queued = static_cast<int64_t>(queue_.size());
  return s;
}

void Publisher::Send(const EventBatch& batch) {
  const uint64_t seq = next_seq_++;
  std::string payload = EncodeBatch(batch);
  const bool ok =
      SendFrames(sockets_->pub, {options_.topic, BigEndian(seq), payload});
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.batches;
    stats_.events += static_cast<int64_t>(batch.events.size());
    if (batch.events.empty()) ++stats_.heartbeats;
    if (!ok) ++stats_.send_errors;
  }
  if (options_.buffer_batches == 0) return;
  if (static_cast<int32_t>(buffer_.size()) >= options_.buffer_batches) {
    buffer_.pop_front();
  }
  buffer_.emplace_back(seq, std::move(payload));
}

void Publisher::ServeReplay() {
  std::vector<std::string> req;
  while (RecvFrames(sockets_->replay, &req)) {
    // [client id, empty delimiter, start sequence]
    if (req.size() != 3 || !req[1].empty() || req[2].size() != 8) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.bad_replay_requests;
      continue;
    }
    uint64_t start = 0;
    for (const char c : req[2]) start = (start << 8) | static_cast<uint8_t>(c);
    int64_t sent = 0;
    for (const auto& [seq, payload] : buffer_) {
      if (seq < start) continue;
      SendFrames(sockets_->replay,
                 {req[0], "", options_.topic, BigEndian(seq), payload});
      ++sent;
    }
    {
      // Counted before the end marker goes: a client that has it sees
      // the count.
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.replays;
      stats_.replayed_batches += sent;
    }
    SendFrames(sockets_->replay, {req[0], "", "", BigEndian(~0ULL), ""});
  }
}

void Publisher::Run() {
  pthread_setname_np(pthread_self(), "kv-events");
  absl::Time last_send = absl::Now();
  while (true) {
    int timeout_ms = -1;
    if (options_.heartbeat > absl::ZeroDuration()) {
      const absl::Duration left = last_send + options_.heartbeat - absl::Now();
      timeout_ms = static_cast<int>(
          std::max<int64_t>(0, absl::ToInt64Milliseconds(left) + 1));
    }
    zmq_pollitem_t items[2] = {
        {nullptr, sockets_->wake_fd, ZMQ_POLLIN, 0},
        {sockets_->replay, 0, ZMQ_POLLIN, 0},
    };
    const int n = sockets_->replay != nullptr ? 2 : 1;
    if (zmq_poll(items, n, timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("kv events: zmq_poll: {}", zmq_strerror(errno));
    }
    if ((items[0].revents & ZMQ_POLLIN) != 0) {
      uint64_t count = 0;
      (void)!read(sockets_->wake_fd, &count, sizeof(count));
    }
    std::deque<EventBatch> batches;
    bool stop = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      batches.swap(queue_);
      stop = stop_;
    }
    for (const EventBatch& b : batches) Send(b);
    if (!batches.empty()) last_send = absl::Now();
    if (n == 2 && (items[1].revents & ZMQ_POLLIN) != 0) ServeReplay();
    if (stop) return;
    if (options_.heartbeat > absl::ZeroDuration() &&
        absl::Now() >= last_send + options_.heartbeat) {
      Send(EventBatch{
          absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), {}, 0});
      last_send = absl::Now();
    }
  }
}

}  // namespace kvserve::kvevents
