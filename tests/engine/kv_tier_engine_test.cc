// The disk tier through the engine with the real default model: a prompt
// computed by one engine is loaded by the next from the same directory
// (a restart), its greedy tokens equal to a run without tiers; a prefix
// evicted from the pool comes back from disk; another cache_salt never
// hits; a write fault leaves serving untouched.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/engine.h"
#include "engine/runner/loaded_model.h"
#include "gtest/gtest.h"

namespace kvserve::engine {
namespace {

namespace fs = std::filesystem;

constexpr char kModel[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "kvtier_eng_XXXXXX").string();
    path_ = mkdtemp(t.data()) != nullptr ? t : "";
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

EngineConfig Config(const std::string& disk_dir, int blocks = 64) {
  EngineConfig c;
  c.device = Device::kCpu;
  c.scheduler.block_size = 16;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_num_batched_tokens = 256;
  // int8: 30 layers x 3 KV heads x 2 x 68 bytes = 12,240 bytes a token.
  c.kv_cache_dtype = kvcache::KvDtype::kInt8;
  c.kv_cache_bytes = int64_t{blocks} * 16 * 12240;
  c.swap_space_bytes = 0;
  c.kv_tiers.disk_dir = disk_dir;
  c.kv_tiers.disk_bytes = int64_t{256} << 20;
  return c;
}

std::unique_ptr<Engine> MakeEngine(const EngineConfig& c) {
  absl::StatusOr<LoadedModel> m = LoadModel(kModel, Device::kCpu);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  absl::StatusOr<std::unique_ptr<Engine>> e =
      Engine::Create(c, *std::move(m), EngineOptions{}, nullptr);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *std::move(e) : nullptr;
}

struct Outcome {
  std::vector<int32_t> tokens;
  Usage usage;
};

RequestSpec Prompt(int seed, int len, const std::string& salt = "") {
  RequestSpec s;
  for (int t = 0; t < len; ++t) {
    s.prompt_tokens.push_back(200 + (t * 37 + seed * 101) % 20000);
  }
  s.max_tokens = 8;
  s.sampling.temperature = 0;
  s.ignore_eos = true;
  s.cache_salt = salt;
  return s;
}

// Runs `spec` to the end.
Outcome RunToEnd(Engine& engine, const RequestSpec& spec) {
  Outcome o;
  absl::Mutex mu;
  bool done = false;
  absl::StatusOr<std::shared_ptr<StreamState>> st = engine.Submit(spec);
  EXPECT_TRUE(st.ok()) << st.status();
  if (!st.ok()) return o;
  StreamState* raw = st->get();
  raw->Attach([&](const StreamDelta& d) {
    absl::MutexLock lock(&mu);
    o.tokens.insert(o.tokens.end(), d.token_ids.begin(), d.token_ids.end());
    if (d.finished) {
      o.usage = d.usage;
      done = true;
    }
    raw->Ack();
  });
  absl::MutexLock lock(&mu);
  mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(120));
  EXPECT_TRUE(done);
  return o;
}

TEST(KvTierEngineTest, ARestartedEngineLoadsThePromptFromDisk) {
  TempDir dir;
  const RequestSpec p = Prompt(1, 150);  // 9 full blocks below token 149
  Outcome plain;
  {
    std::unique_ptr<Engine> off = MakeEngine(Config(""));
    ASSERT_NE(off, nullptr);
    plain = RunToEnd(*off, p);
  }
  Outcome first;
  {
    std::unique_ptr<Engine> a = MakeEngine(Config(dir.path()));
    ASSERT_NE(a, nullptr);
    first = RunToEnd(*a, p);
    EXPECT_EQ(a->FlushKvTiers(absl::Now() + absl::Seconds(10)), 0);
  }
  EXPECT_EQ(first.usage.cached_prompt_tokens, 0);
  std::unique_ptr<Engine> b = MakeEngine(Config(dir.path()));
  ASSERT_NE(b, nullptr);
  const Outcome second = RunToEnd(*b, p);
  EXPECT_EQ(second.usage.cached_prompt_tokens, 144);
  EXPECT_EQ(second.usage.kv.cached_tokens_disk, 144);
  EXPECT_EQ(second.usage.kv.cached_tokens_device, 0);
  EXPECT_EQ(first.tokens, plain.tokens);
  EXPECT_EQ(second.tokens, plain.tokens);
  // Again: now in the pool.
  const Outcome third = RunToEnd(*b, p);
  EXPECT_EQ(third.usage.cached_prompt_tokens, 149);  // with the tail
  EXPECT_EQ(third.usage.kv.cached_tokens_disk, 0);
  EXPECT_EQ(third.tokens, plain.tokens);
}

TEST(KvTierEngineTest, APrefixEvictedFromThePoolComesBackFromDisk) {
  TempDir dir;
  // 24 blocks: each 150-token request holds 10; three others evict it.
  std::unique_ptr<Engine> e = MakeEngine(Config(dir.path(), 24));
  ASSERT_NE(e, nullptr);
  const RequestSpec p = Prompt(1, 150);
  const Outcome first = RunToEnd(*e, p);
  for (int other = 2; other <= 4; ++other) RunToEnd(*e, Prompt(other, 150));
  e->FlushKvTiers(absl::Now() + absl::Seconds(10));
  const Outcome again = RunToEnd(*e, p);
  EXPECT_EQ(again.usage.cached_prompt_tokens, 144);
  EXPECT_EQ(again.usage.kv.cached_tokens_disk, 144);
  EXPECT_EQ(again.tokens, first.tokens);
}

TEST(KvTierEngineTest, AnotherSaltNeverHits) {
  TempDir dir;
  {
    std::unique_ptr<Engine> a = MakeEngine(Config(dir.path()));
    ASSERT_NE(a, nullptr);
    RunToEnd(*a, Prompt(1, 150, "alice"));
    a->FlushKvTiers(absl::Now() + absl::Seconds(10));
  }
  std::unique_ptr<Engine> b = MakeEngine(Config(dir.path()));
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(RunToEnd(*b, Prompt(1, 150, "bob")).usage.cached_prompt_tokens, 0);
  EXPECT_EQ(RunToEnd(*b, Prompt(1, 150)).usage.cached_prompt_tokens, 0);
  EXPECT_EQ(RunToEnd(*b, Prompt(1, 150, "alice")).usage.kv.cached_tokens_disk,
            144);
}

TEST(KvTierEngineTest, WriteFaultsLeaveServingUntouched) {
  TempDir dir;
  EngineConfig c = Config(dir.path());
  c.kv_tiers.inject_write_errno = ENOSPC;
  std::unique_ptr<Engine> e = MakeEngine(c);
  ASSERT_NE(e, nullptr);
  const RequestSpec p = Prompt(1, 150);
  const Outcome a = RunToEnd(*e, p);
  const Outcome b = RunToEnd(*e, Prompt(2, 150));
  EXPECT_EQ(a.tokens.size(), 8u);
  EXPECT_EQ(b.tokens.size(), 8u);
  EXPECT_EQ(RunToEnd(*e, p).tokens, a.tokens);
}

}  // namespace
}  // namespace kvserve::engine
