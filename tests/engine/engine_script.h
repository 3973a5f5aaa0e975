// Scripted engine runs for tests: an Engine on a FakeBackend, created
// paused so that the requests a test submits up front are admitted together
// in submission order, with every delta of every stream recorded against
// the step (FakeBackend::step) after which the engine emitted it. Requests
// submitted or aborted from a FakeBackend action at step k are taken before
// step k + 1, so whole runs are deterministic without sleeps.
#pragma once

#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/check.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "tests/engine/fake_backend.h"

namespace kvserve::engine {

inline void PrintTo(FinishReason r, std::ostream* os) {
  *os << FinishReasonName(r);
}

}  // namespace kvserve::engine

namespace kvserve::engine::test {

// What one stream (completion) got after one step: `stream` is the name
// given to Submit, or "name#i" for completion i of an n > 1 request;
// `finish` is kNone while it runs on.
struct Row {
  int64_t step = 0;
  std::string stream;
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  bool operator==(const Row&) const = default;
};

inline void PrintTo(const Row& r, std::ostream* os) {
  *os << "{" << r.step << ", \"" << r.stream << "\", {"
      << absl::StrJoin(r.tokens, ", ") << "}";
  if (r.finish != FinishReason::kNone)
    *os << ", " << FinishReasonName(r.finish);
  *os << "}";
}

// Everything one completion got.
struct Completion {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string error;
  Usage usage;
};

// A greedy request for `prompt`.
inline RequestSpec Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  RequestSpec spec;
  spec.prompt_tokens = std::move(prompt);
  spec.max_tokens = max_tokens;
  spec.sampling.temperature = 0;
  return spec;
}

// Small pools and blocks of 4 tokens, no watermark.
inline EngineConfig SmallConfig() {
  EngineConfig c;
  c.scheduler.block_size = 4;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_num_batched_tokens = 64;
  c.scheduler.watermark = 0;
  return c;
}

class Script {
 public:
  Script(const EngineConfig& config, FakeBackend::Options backend)
      : registry_(std::make_shared<prometheus::Registry>()) {
    backend.block_size = config.scheduler.block_size;
    auto fake = std::make_unique<FakeBackend>(backend);
    backend_ = fake.get();
    EngineOptions options;
    options.backend = std::move(fake);
    options.start_paused = true;
    auto engine =
        Engine::Create(config, FakeModel(), std::move(options), registry_);
    KV_CHECK(engine.ok(), "Engine::Create: ", engine.status().ToString());
    engine_ = *std::move(engine);
  }
  explicit Script(const EngineConfig& config = SmallConfig())
      : Script(config, FakeBackend::Options{}) {}
  // The engine goes first: stopping it finishes what is left, through the
  // sinks, which need the rest.
  ~Script() { engine_.reset(); }

  FakeBackend& backend() { return *backend_; }
  Engine& engine() { return *engine_; }
  prometheus::Registry& registry() { return *registry_; }

  // Submits `spec` as stream `name`; any thread, FakeBackend actions
  // included. Returns its request id (for Abort).
  absl::StatusOr<RequestId> Submit(const std::string& name, RequestSpec spec) {
    const int32_t n = spec.n;
    absl::StatusOr<std::shared_ptr<StreamState>> state =
        engine_->Submit(std::move(spec));
    if (!state.ok()) return state.status();
    auto stream = std::make_unique<Stream>();
    stream->name = name;
    stream->n = n;
    stream->state = *state;
    Stream* s = stream.get();
    {
      absl::MutexLock lock(&mu_);
      streams_.push_back(std::move(stream));
    }
    // Acknowledged at once: every delta reaches the sink on the thread that
    // produced it, the engine thread.
    StreamState* raw = s->state.get();
    raw->Attach([this, s, raw](StreamDelta d) {
      OnDelta(*s, std::move(d));
      raw->Ack();
    });
    return s->state->id();
  }

  // Lets the engine take what was submitted.
  void Start() { engine_->Start(); }
  // Waits until every submitted stream finished; after `timeout`, fails the
  // test naming the streams still open and returns false.
  [[nodiscard]] bool WaitAll(absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock lock(&mu_);
    auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      for (const auto& s : streams_) {
        if (!s->done) return false;
      }
      return true;
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&done), timeout)) return true;
    std::vector<std::string> open;
    for (const auto& s : streams_) {
      if (!s->done) open.push_back(s->name);
    }
    ADD_FAILURE() << "streams still open after " << timeout << ": "
                  << absl::StrJoin(open, ", ");
    return false;
  }
  // Start, then WaitAll.
  [[nodiscard]] bool Run() {
    Start();
    return WaitAll();
  }

  // Every step's output, one row per (step, stream), by step then stream.
  std::vector<Row> Rows() const {
    absl::MutexLock lock(&mu_);
    std::map<std::pair<int64_t, std::string>, Row> merged;
    for (const Row& e : events_) {
      Row& row = merged[{e.step, e.stream}];
      row.step = e.step;
      row.stream = e.stream;
      row.tokens.insert(row.tokens.end(), e.tokens.begin(), e.tokens.end());
      if (e.finish != FinishReason::kNone) row.finish = e.finish;
    }
    std::vector<Row> rows;
    for (auto& [key, row] : merged) rows.push_back(std::move(row));
    return rows;
  }
  // What completion `stream` ("name" or "name#i") got so far.
  Completion Get(const std::string& stream) const {
    absl::MutexLock lock(&mu_);
    auto it = completions_.find(stream);
    return it == completions_.end() ? Completion{} : it->second;
  }

 private:
  struct Stream {
    std::string name;
    int32_t n = 1;
    std::shared_ptr<StreamState> state;
    bool done = false;
  };

  void OnDelta(Stream& s, StreamDelta d) {
    const int64_t step = backend_->step();
    const std::string name =
        s.n > 1 ? absl::StrCat(s.name, "#", d.index) : s.name;
    absl::MutexLock lock(&mu_);
    Completion& c = completions_[name];
    c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
    c.text += d.text;
    if (d.index_finished) {
      c.finish = d.finish_reason;
      c.error = d.error;
      c.usage = d.usage;
    }
    events_.push_back(
        {step, name, std::move(d.token_ids),
         d.index_finished ? d.finish_reason : FinishReason::kNone});
    if (d.finished) s.done = true;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  FakeBackend* backend_;  // owned by engine_
  std::unique_ptr<Engine> engine_;
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Stream>> streams_ ABSL_GUARDED_BY(mu_);
  std::vector<Row> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Completion> completions_ ABSL_GUARDED_BY(mu_);
};

// The sum of counter or gauge `name`'s series with label `key` = `value` (an
// empty `key`: its first series) in `registry`; 0 if absent.
inline double MetricValue(prometheus::Registry& registry,
                          const std::string& name, const std::string& key,
                          const std::string& value) {
  double sum = 0;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      bool match = key.empty();
      for (const prometheus::ClientMetric::Label& l : m.label) {
        match = match || (l.name == key && l.value == value);
      }
      if (match) {
        sum += f.type == prometheus::MetricType::Counter ? m.counter.value
                                                         : m.gauge.value;
        if (key.empty()) return sum;
      }
    }
  }
  return sum;
}

}  // namespace kvserve::engine::test
