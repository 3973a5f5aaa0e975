// Publisher: sends KV event batches over ZMQ as vLLM's ZmqEventPublisher
// does, from a thread of its own, so the engine step never waits on a
// socket.
//
// Sockets (libzmq's C API: its calls return errors, where cppzmq throws):
//   - PUB on `endpoint`, bound when it names a wildcard host ("*" or "::")
//     or an ipc:// / inproc:// path, connected otherwise (to a router that
//     binds), exactly vLLM's rule. Each message is three frames:
//     [topic, sequence (8 bytes, big-endian, from 0), msgpack batch].
//   - ROUTER on `replay_endpoint` (optional, always bound): a client sends
//     [empty, start sequence (8 bytes)]; it gets [empty, topic, seq, batch]
//     for every buffered batch from that sequence on, then
//     [empty, empty, -1 (8 bytes of 0xff), empty] (vLLM >= 0.26's replies).
// A batch with no events is published every `heartbeat` of silence; it
// takes the next sequence number like any batch, so a subscriber sees no
// gap (llm-d asks for a replay on a gap and resets a pod whose sequence
// goes back: a restarted daemon starts at 0 with AllBlocksCleared).
//
// Bounded everywhere: Publish never blocks (a full queue drops the batch,
// counted); the replay buffer keeps the last `buffer_batches`; the PUB
// socket's high-water mark drops messages a slow subscriber cannot take
// (ZMQ's PUB semantics). CURVE (`curve_secret_key`, Z85): both sockets act
// as CURVE servers, so only clients that know the server's public key can
// read the stream, encrypted.
//
// Thread safety: Publish and stats from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvevents/kv_event.h"

namespace kvserve::kvevents {

struct PublisherOptions {
  std::string endpoint;            // e.g. tcp://127.0.0.1:5557, tcp://*:5557
  std::string replay_endpoint;     // empty: no replay socket
  std::string topic;               // llm-d: kv@<pod ip:port>@<model>
  int32_t queue_batches = 4096;    // engine -> publisher, at most
  int32_t buffer_batches = 10000;  // kept for replay (vLLM's buffer_steps)
  int32_t hwm = 100000;            // PUB send high-water mark (vLLM's)
  absl::Duration heartbeat = absl::Seconds(1);  // zero: none
  std::string curve_secret_key;  // Z85 (40 characters); empty: plain
};

struct PublisherStats {
  int64_t batches = 0;          // published, heartbeats included
  int64_t events = 0;           // in published batches
  int64_t heartbeats = 0;       // empty batches sent on silence
  int64_t dropped_batches = 0;  // queue full
  int64_t dropped_events = 0;
  int64_t send_errors = 0;  // zmq_send failures (messages lost)
  int64_t replays = 0;      // replay requests served
  int64_t replayed_batches = 0;
  int64_t bad_replay_requests = 0;
  int64_t queued = 0;
};

class Publisher {
 public:
  // Opens the sockets (InvalidArgument naming the endpoint ZMQ refused, or
  // a CURVE key that is not 40 Z85 characters; FailedPrecondition when
  // libzmq has no CURVE) and starts the thread.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Publisher>> Create(
      PublisherOptions options);
  // Sends what is queued, then closes (lingering up to a second).
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Queues `batch` for the thread; false (dropped, counted) when full.
  bool Publish(EventBatch batch);
  [[nodiscard]] PublisherStats stats() const;
  [[nodiscard]] const PublisherOptions& options() const { return options_; }
  // Whether `endpoint` is bound (vLLM's rule) rather than connected.
  [[nodiscard]] static bool Binds(const std::string& endpoint);

 private:
  struct Sockets;
  Publisher(PublisherOptions options, std::unique_ptr<Sockets> sockets);
  void Run();
  void Send(const EventBatch& batch);
  void ServeReplay();
  void Wake() const;

  const PublisherOptions options_;
  std::unique_ptr<Sockets> sockets_;
  mutable std::mutex mu_;
  std::deque<EventBatch> queue_;  // guarded by mu_
  PublisherStats stats_;          // guarded by mu_
  bool stop_ = false;             // guarded by mu_
  // Publisher thread only.
  uint64_t next_seq_ = 0;
  std::deque<std::pair<uint64_t, std::string>> buffer_;
  std::thread thread_;
};

}  // namespace kvserve::kvevents
