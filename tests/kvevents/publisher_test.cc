// The KV event wire format and its publisher. The expected bytes come from
// an independent encoder: Python's msgpack 1.2.4 packing the same batch as
// vLLM's msgspec structs (array_like, tag first) lay it out, and vLLM's
// publisher's frames and replay protocol (vllm/distributed/kv_events.py).
#include "kvevents/publisher.h"

#include <unistd.h>
#include <zmq.h>

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvevents/kv_event.h"

namespace kvserve::kvevents {
namespace {

std::string Hex(const std::string& bytes) {
  return absl::BytesToHexString(bytes);
}

TEST(KvEventTest, EncodesVllmsPositionalForm) {
  EventBatch b;
  b.ts = 1.5;
  BlockStored s;
  s.hashes = {0x1122334455667788ULL};
  s.parent = 0xA1B2C3D4E5F60718ULL;
  s.token_ids = {1, 2, 3, 4};
  s.block_size = 4;
  b.events.emplace_back(s);
  b.events.emplace_back(BlockRemoved{{0x1122334455667788ULL}, Medium::kGpu});
  b.events.emplace_back(AllBlocksCleared{});
  BlockStored root;  // a first block: parent nil; wide token ids
  root.hashes = {7};
  root.token_ids = {300, 70000};
  root.block_size = 2;
  b.events.emplace_back(root);
  // msgpack.packb([1.5, [["BlockStored", [0x1122334455667788],
  //   0xA1B2C3D4E5F60718, [1, 2, 3, 4], 4, None, "GPU", None],
  //   ["BlockRemoved", [0x1122334455667788], "GPU"], ["AllBlocksCleared"],
  //   ["BlockStored", [7], None, [300, 70000], 2, None, "GPU", None]], 0])
  EXPECT_EQ(Hex(EncodeBatch(b)),
            "93cb3ff80000000000009498ab426c6f636b53746f72656491cf112233445566"
            "7788cfa1b2c3d4e5f60718940102030404c0a3475055c093ac426c6f636b5265"
            "6d6f76656491cf1122334455667788a347505591b0416c6c426c6f636b73436c"
            "656172656498ab426c6f636b53746f7265649107c092cd012cce0001117002c0"
            "a3475055c000");
}

TEST(KvEventTest, CarriesTheLoraName) {
  EventBatch b;
  b.ts = 2.0;
  BlockStored s;
  s.hashes = {7};
  s.token_ids = {1, 2};
  s.block_size = 2;
  s.lora_name = "smollm2@team";
  b.events.emplace_back(s);
  // msgpack.packb([2.0, [["BlockStored", [7], None, [1, 2], 2, None,
  //   "GPU", "smollm2@team"]], 0])
  EXPECT_EQ(Hex(EncodeBatch(b)),
            "93cb40000000000000009198ab426c6f636b53746f7265649107c09201020"
            "2c0a3475055ac736d6f6c6c6d32407465616d00");
}

TEST(KvEventTest, HeartbeatIsAnEmptyBatch) {
  EXPECT_EQ(Hex(EncodeBatch({2.0, {}, 0})), "93cb40000000000000009000");
}

TEST(KvEventTest, MediumNames) {
  EXPECT_STREQ(MediumName(Medium::kGpu), "GPU");
  EXPECT_STREQ(MediumName(Medium::kCpu), "CPU");
  EXPECT_STREQ(MediumName(Medium::kStorage), "STORAGE");
}

TEST(PublisherTest, BindsAsVllmDoes) {
  EXPECT_TRUE(Publisher::Binds("tcp://*:5557"));
  EXPECT_TRUE(Publisher::Binds("tcp://[::]:5557"));
  EXPECT_TRUE(Publisher::Binds("ipc:///tmp/kv.sock"));
  EXPECT_TRUE(Publisher::Binds("inproc://kv"));
  EXPECT_FALSE(Publisher::Binds("tcp://127.0.0.1:5557"));
  EXPECT_FALSE(Publisher::Binds("tcp://epp.default.svc:5557"));
}

TEST(PublisherTest, RefusesBadOptions) {
  PublisherOptions o;
  o.endpoint = "nonsense://x";
  EXPECT_EQ(Publisher::Create(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.endpoint = "inproc://refuse";
  o.curve_secret_key = "short";
  absl::Status st = Publisher::Create(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("40 characters"), std::string::npos) << st;
}

// A raw libzmq socket for the test's side.
class Socket {
 public:
  Socket(void* ctx, int type) : s_(zmq_socket(ctx, type)) {
    const int linger = 0;
    zmq_setsockopt(s_, ZMQ_LINGER, &linger, sizeof(linger));
  }
  ~Socket() { zmq_close(s_); }
  void* get() const { return s_; }
  // One whole message, waiting up to `ms`; empty on a timeout.
  std::vector<std::string> Recv(int ms) const {
    std::vector<std::string> frames;
    zmq_pollitem_t item{s_, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, ms) <= 0) return frames;
    while (true) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      if (zmq_msg_recv(&m, s_, 0) < 0) break;
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)),
                          zmq_msg_size(&m));
      const bool more = zmq_msg_more(&m) != 0;
      zmq_msg_close(&m);
      if (!more) break;
    }
    return frames;
  }

 private:
  void* s_;
};

std::string Seq(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
  return s;
}

EventBatch OneRemoval(uint64_t hash) {
  EventBatch b;
  b.ts = 1;
  b.events.emplace_back(BlockRemoved{{hash}, Medium::kGpu});
  return b;
}

uint64_t SeqOf(const std::string& frame) {
  uint64_t seq = 0;
  for (const char c : frame) seq = (seq << 8) | static_cast<uint8_t>(c);
  return seq;
}

TEST(PublisherTest, PublishesFramesInOrderAndReplays) {
  void* ctx = zmq_ctx_new();
  {
    // The subscriber binds and the publisher connects to it, as llm-d's
    // endpoint picker and a vLLM pod do (a host that is no wildcard).
    Socket sub(ctx, ZMQ_SUB);
    ASSERT_EQ(zmq_bind(sub.get(), "tcp://127.0.0.1:*"), 0);
    zmq_setsockopt(sub.get(), ZMQ_SUBSCRIBE, "kv@", 3);
    char bound[256] = {};
    size_t len = sizeof(bound);
    zmq_getsockopt(sub.get(), ZMQ_LAST_ENDPOINT, bound, &len);
    PublisherOptions o;
    o.endpoint = bound;
    ASSERT_FALSE(Publisher::Binds(o.endpoint));
    o.replay_endpoint =
        absl::StrCat("ipc:///tmp/kvserve-publisher-test-", getpid(), ".sock");
    o.topic = "kv@pod:8000@model";
    o.heartbeat = absl::Milliseconds(50);
    o.buffer_batches = 3;
    absl::StatusOr<std::unique_ptr<Publisher>> pub = Publisher::Create(o);
    ASSERT_TRUE(pub.ok()) << pub.status();
    // Heartbeats flow until the connection is up.
    std::vector<std::string> m = sub.Recv(5000);
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[0], o.topic);
    EXPECT_EQ(m[2].size(), 12u) << "an empty batch";
    uint64_t last = SeqOf(m[1]);
    for (uint64_t h = 1; h <= 4; ++h) {
      ASSERT_TRUE((*pub)->Publish(OneRemoval(h)));
    }
    // The next batches carry hashes 1..4 in order, each sequence number one
    // past the last (a heartbeat between them takes one too).
    std::vector<uint64_t> seqs;
    while (seqs.size() < 4) {
      m = sub.Recv(5000);
      ASSERT_EQ(m.size(), 3u);
      EXPECT_EQ(SeqOf(m[1]), last + 1);
      last = SeqOf(m[1]);
      if (m[2].size() == 12) continue;  // a heartbeat
      EXPECT_EQ(m[2], EncodeBatch(OneRemoval(seqs.size() + 1)));
      seqs.push_back(last);
    }
    // Replay from the second of them: the buffer keeps 3 batches, so the
    // reply holds those at or after it still buffered, then the end marker.
    Socket dealer(ctx, ZMQ_DEALER);
    ASSERT_EQ(zmq_connect(dealer.get(), o.replay_endpoint.c_str()), 0);
    const std::string start = Seq(seqs[1]);
    zmq_send(dealer.get(), "", 0, ZMQ_SNDMORE);
    zmq_send(dealer.get(), start.data(), start.size(), 0);
    std::vector<uint64_t> replayed;
    while (true) {
      m = dealer.Recv(5000);
      ASSERT_EQ(m.size(), 4u);  // empty, topic, seq, payload
      EXPECT_TRUE(m[0].empty());
      if (m[1].empty()) {
        EXPECT_EQ(m[2], std::string(8, '\xff'));
        EXPECT_TRUE(m[3].empty());
        break;
      }
      EXPECT_EQ(m[1], o.topic);
      EXPECT_GE(SeqOf(m[2]), seqs[1]);
      replayed.push_back(SeqOf(m[2]));
    }
    ASSERT_FALSE(replayed.empty());
    EXPECT_LE(replayed.size(), 3u);
    EXPECT_GE(replayed.back(), last) << "up to the newest batch";
    EXPECT_EQ((*pub)->stats().replays, 1);
    // A malformed request is counted and answered with nothing.
    zmq_send(dealer.get(), "x", 1, 0);
    EXPECT_TRUE(dealer.Recv(300).empty());
    EXPECT_EQ((*pub)->stats().bad_replay_requests, 1);
  }
  zmq_ctx_term(ctx);
}

// A replay of more batches than a ROUTER's default high-water mark (1000)
// sends every one of them.
TEST(PublisherTest, AReplayLongerThanTheDefaultHighWaterMarkIsWhole) {
  void* ctx = zmq_ctx_new();
  {
    PublisherOptions o;
    o.endpoint = "inproc://kv-events-long-replay";
    o.topic = "kv@pod@model";
    o.replay_endpoint = absl::StrCat("ipc:///tmp/kvserve-publisher-test-long-",
                                     getpid(), ".sock");
    o.heartbeat = absl::ZeroDuration();
    o.buffer_batches = 5000;
    o.queue_batches = 5000;
    absl::StatusOr<std::unique_ptr<Publisher>> pub = Publisher::Create(o);
    ASSERT_TRUE(pub.ok()) << pub.status();
    constexpr int kBatches = 3000;
    for (int i = 0; i < kBatches; ++i) {
      ASSERT_TRUE((*pub)->Publish(OneRemoval(i)));
    }
    while ((*pub)->stats().batches < kBatches)
      absl::SleepFor(absl::Milliseconds(5));
    Socket dealer(ctx, ZMQ_DEALER);
    ASSERT_EQ(zmq_connect(dealer.get(), o.replay_endpoint.c_str()), 0);
    const std::string start = Seq(0);
    zmq_send(dealer.get(), "", 0, ZMQ_SNDMORE);
    zmq_send(dealer.get(), start.data(), start.size(), 0);
    int replayed = 0;
    while (true) {
      std::vector<std::string> m = dealer.Recv(5000);
      ASSERT_EQ(m.size(), 4u) << "after " << replayed;
      if (m[1].empty()) break;
      EXPECT_EQ(SeqOf(m[2]), static_cast<uint64_t>(replayed));
      ++replayed;
    }
    EXPECT_EQ(replayed, kBatches);
  }
  zmq_ctx_term(ctx);
}

TEST(PublisherTest, AFullQueueDropsAndCounts) {
  PublisherOptions o;
  o.endpoint = "inproc://kv-events-full";
  o.queue_batches = 1;
  o.heartbeat = absl::ZeroDuration();
  absl::StatusOr<std::unique_ptr<Publisher>> pub = Publisher::Create(o);
  ASSERT_TRUE(pub.ok()) << pub.status();
  int accepted = 0;
  for (int i = 0; i < 1000; ++i) accepted += (*pub)->Publish(OneRemoval(i));
  const PublisherStats s = (*pub)->stats();
  EXPECT_EQ(s.dropped_batches, 1000 - accepted);
  EXPECT_GT(s.dropped_batches, 0) << "1000 publishes outran a 1-batch queue";
  EXPECT_EQ(s.dropped_events, s.dropped_batches);
}

}  // namespace
}  // namespace kvserve::kvevents
