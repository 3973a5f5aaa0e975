// Concurrency end to end on the real binary: 16 concurrent streaming
// clients each get exactly the greedy tokens they get alone, and the token
// counters in /metrics equal the sums the clients saw; a KV pool made
// deliberately small forces preemptions without changing any output; a
// request that can never fit the pool is OUT_OF_RANGE at once; cancelled
// streams give all their KV blocks back.
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/server/server_testutil.h"

namespace kvserve::server::testing {
namespace {

constexpr int kClients = 16;

std::vector<std::string> Prompts() {
  static const char* kTopics[kClients] = {
      "the sea",      "a mountain", "bread",    "the moon",
      "a river",      "winter",     "a robot",  "the city",
      "a library",    "music",      "a cat",    "the desert",
      "a lighthouse", "rain",       "a garden", "the stars"};
  std::vector<std::string> out;
  for (const char* t : kTopics) {
    out.push_back(absl::StrCat("Write one sentence about ", t, "."));
  }
  return out;
}

std::vector<StreamResult> RunSolo(v1::KvServe::Stub& stub,
                                  const std::vector<std::string>& prompts,
                                  int max_tokens) {
  std::vector<StreamResult> out;
  for (const std::string& p : prompts) {
    out.push_back(RunGenerate(stub, GreedyRequest(p, max_tokens)));
  }
  return out;
}

std::vector<StreamResult> RunConcurrent(v1::KvServe::Stub& stub,
                                        const std::vector<std::string>& prompts,
                                        int max_tokens) {
  std::vector<StreamResult> out(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      out[i] = RunGenerate(stub, GreedyRequest(prompts[i], max_tokens));
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

void ExpectSameTokens(const std::vector<StreamResult>& solo,
                      const std::vector<StreamResult>& batch, int max_tokens) {
  ASSERT_EQ(solo.size(), batch.size());
  for (size_t i = 0; i < solo.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("client ", i));
    ASSERT_TRUE(solo[i].status.ok()) << solo[i].status.error_message();
    ASSERT_TRUE(batch[i].status.ok()) << batch[i].status.error_message();
    EXPECT_EQ(solo[i].tokens.size(), static_cast<size_t>(max_tokens));
    EXPECT_EQ(batch[i].tokens, solo[i].tokens);
    EXPECT_EQ(batch[i].text, solo[i].text);
    EXPECT_EQ(batch[i].last.finish_reason(), v1::FINISH_REASON_LENGTH);
  }
}

v1::ModelInfo GetInfo(v1::KvServe::Stub& stub) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  EXPECT_TRUE(stub.GetModelInfo(&ctx, {}, &info).ok());
  return info;
}

TEST(ConcurrencyE2eTest, SixteenConcurrentStreamsMatchSoloGreedy) {
  constexpr int kMaxTokens = 16;
  auto server =
      ServerProcess::Start({"--kv-cache-bytes", "128MiB", "--max-model-len",
                            "512", "--max-num-seqs", "16"});
  ASSERT_NE(server, nullptr);
  auto stub = server->Stub();
  const auto prompts = Prompts();
  const auto solo = RunSolo(*stub, prompts, kMaxTokens);
  const auto batch = RunConcurrent(*stub, prompts, kMaxTokens);
  ExpectSameTokens(solo, batch, kMaxTokens);

  // Token counters equal what the clients saw (solo + concurrent runs).
  double prompt_sum = 0, completion_sum = 0;
  for (const auto* runs : {&solo, &batch}) {
    for (const StreamResult& r : *runs) {
      prompt_sum += r.last.usage().prompt_tokens();
      completion_sum += r.last.usage().completion_tokens();
      EXPECT_EQ(r.last.usage().completion_tokens(),
                static_cast<int>(r.tokens.size()));
    }
  }
  std::string scrape;
  EXPECT_TRUE(WaitForMetrics(
      server->http_port(),
      [&](const auto& m) {
        return Get(m, "kvserve_generation_tokens_total") == completion_sum &&
               Get(m, "kvserve_prompt_tokens_total") == prompt_sum &&
               Get(m, R"(kvserve_requests_finished_total{reason="length"})") ==
                   2 * kClients;
      },
      absl::Seconds(10), &scrape))
      << "expected generation " << completion_sum << ", prompt " << prompt_sum
      << "\n"
      << scrape;
}

TEST(ConcurrencyE2eTest, SmallKvCacheForcesPreemptionWithIdenticalOutput) {
  constexpr int kMaxTokens = 40;
  constexpr int kPoolBlocks = 20;  // each request needs up to 4 of 16 tokens
  const auto prompts = Prompts();
  std::vector<StreamResult> solo;
  int64_t bytes_per_token = 0;
  {
    auto roomy = ServerProcess::Start(
        {"--kv-cache-bytes", "128MiB", "--max-model-len", "512"});
    ASSERT_NE(roomy, nullptr);
    auto stub = roomy->Stub();
    bytes_per_token = GetInfo(*stub).kv_bytes_per_token();
    solo = RunSolo(*stub, prompts, kMaxTokens);
  }
  ASSERT_GT(bytes_per_token, 0);
  const int64_t pool_bytes = int64_t{kPoolBlocks} * 16 * bytes_per_token;
  auto server = ServerProcess::Start(
      {"--kv-cache-bytes", absl::StrCat(pool_bytes), "--max-model-len", "512",
       "--max-num-seqs", "16", "--block-size", "16",
       // Forced: with swap space, auto may pick swap (tested elsewhere).
       "--preemption-mode", "recompute"});
  ASSERT_NE(server, nullptr);
  auto stub = server->Stub();
  const v1::ModelInfo info = GetInfo(*stub);
  ASSERT_LE(info.num_blocks(), kPoolBlocks);
  ASSERT_GE(info.num_blocks(), 4);

  const auto batch = RunConcurrent(*stub, prompts, kMaxTokens);
  ExpectSameTokens(solo, batch, kMaxTokens);
  std::string scrape;
  EXPECT_TRUE(WaitForMetrics(
      server->http_port(),
      [](const auto& m) {
        return Get(m,
                   R"(kvserve_preemptions_total{mode="recompute",reason="no_free_block"})") >
                   0 &&
               Get(m, R"(kvserve_kv_blocks{state="active"})") == 0;
      },
      absl::Seconds(10), &scrape))
      << scrape;

  // Prompt + max_tokens beyond the whole pool: OUT_OF_RANGE, at once.
  v1::GenerateRequest big;
  for (int i = 0; i < 100; ++i) big.mutable_prompt_token_ids()->add_ids(42);
  big.mutable_sampling()->set_max_tokens(kPoolBlocks * 16);
  big.mutable_sampling()->set_temperature(0);
  const StreamResult r = RunGenerate(*stub, big, absl::Seconds(10));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::OUT_OF_RANGE)
      << r.status.error_message();
}

TEST(ConcurrencyE2eTest, CancellingStreamsReturnsAllBlocks) {
  constexpr int kStreams = 4;
  auto server = ServerProcess::Start(
      {"--kv-cache-bytes", "128MiB", "--max-model-len", "512"});
  ASSERT_NE(server, nullptr);
  auto stub = server->Stub();
  const auto prompts = Prompts();
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>>
      readers;
  for (int i = 0; i < kStreams; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    ctxs.back()->set_deadline(
        absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    readers.push_back(
        stub->Generate(ctxs.back().get(), GreedyRequest(prompts[i], 400)));
  }
  v1::GenerateResponse m;
  for (auto& reader : readers) ASSERT_TRUE(reader->Read(&m));
  for (auto& ctx : ctxs) ctx->TryCancel();
  for (auto& reader : readers) {
    while (reader->Read(&m)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  std::string scrape;
  EXPECT_TRUE(WaitForMetrics(
      server->http_port(),
      [](const auto& m) {
        return Get(m,
                   R"(kvserve_requests_finished_total{reason="cancelled"})") ==
                   kStreams &&
               Get(m, R"(kvserve_requests{state="running"})") == 0 &&
               Get(m, R"(kvserve_kv_blocks{state="active"})") == 0 &&
               Get(m, R"(kvserve_kv_blocks{state="free"})") +
                       Get(m, R"(kvserve_kv_blocks{state="cached"})") ==
                   Get(m, "kvserve_kv_blocks_capacity");
      },
      absl::Seconds(10), &scrape))
      << scrape;
  // The server still serves.
  EXPECT_TRUE(RunGenerate(*stub, GreedyRequest("Hi", 2)).status.ok());
}

}  // namespace
}  // namespace kvserve::server::testing
