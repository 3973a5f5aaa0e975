// End-to-end tests of the real `kvserve` binary with the default model:
// streaming Generate, Tokenize/Detokenize, GetModelInfo, request validation
// (INVALID_ARGUMENT naming the field), deadlines and cancellation, gRPC
// health and reflection, /metrics (also through `promtool check metrics`),
// /health, /ready, and the SIGTERM drain.
#include <cmath>
#include <cstdio>
#include <fstream>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "gtest/gtest.h"
#include "kvcache/kv_sizing.h"
#include "tests/server/server_testutil.h"

namespace kvserve::server::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kMaxModelLen = 512;

// One server for the suite (a model load per test would dominate the run).
class ServeE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = ServerProcess::Start(
                  {"--max-model-len", "512", "--kv-cache-bytes", "128MiB"})
                  .release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr) << "server did not start";
    stub_ = server_->Stub();
  }

  static ServerProcess* server_;
  std::unique_ptr<v1::KvServe::Stub> stub_;
};
ServerProcess* ServeE2eTest::server_ = nullptr;

std::vector<int32_t> Tokenize(v1::KvServe::Stub& stub, const std::string& s) {
  grpc::ClientContext ctx;
  v1::TokenizeRequest req;
  req.set_text(s);
  v1::TokenizeResponse resp;
  EXPECT_TRUE(stub.Tokenize(&ctx, req, &resp).ok());
  return {resp.token_ids().begin(), resp.token_ids().end()};
}

TEST_F(ServeE2eTest, GreedyStreamEndsWithLengthAndUsage) {
  const auto req = GreedyRequest("The capital of France is", 8);
  const StreamResult a = RunGenerate(*stub_, req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.tokens.size(), 8u);
  EXPECT_GE(a.messages, 1);
  EXPECT_FALSE(a.text.empty());
  EXPECT_EQ(a.last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(a.last.usage().completion_tokens(), 8);
  EXPECT_EQ(a.last.usage().prompt_tokens(),
            static_cast<int>(Tokenize(*stub_, req.prompt()).size()));
  EXPECT_GT(a.last.timings().total_seconds(), 0);
  EXPECT_GE(a.last.timings().total_seconds(),
            a.last.timings().time_to_first_token_seconds());
  // Greedy is deterministic.
  const StreamResult b = RunGenerate(*stub_, req);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
  // The streamed text is the detokenized stream.
  grpc::ClientContext ctx;
  v1::DetokenizeRequest dreq;
  dreq.mutable_token_ids()->Add(a.tokens.begin(), a.tokens.end());
  v1::DetokenizeResponse dresp;
  ASSERT_TRUE(stub_->Detokenize(&ctx, dreq, &dresp).ok());
  EXPECT_EQ(dresp.text(), a.text);
}

TEST_F(ServeE2eTest, RepeatedPromptReportsCachedTokensAndSameOutput) {
  // A prompt of several 16-token blocks that no other test sends.
  std::string prompt = "Prefix caching check:";
  for (int i = 0; i < 12; ++i) prompt += " the quick brown fox jumps";
  const auto req = GreedyRequest(prompt, 8);
  const int prompt_tokens =
      static_cast<int>(Tokenize(*stub_, req.prompt()).size());
  ASSERT_GT(prompt_tokens, 48);
  const StreamResult a = RunGenerate(*stub_, req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.last.usage().cached_prompt_tokens(), 0);
  const StreamResult b = RunGenerate(*stub_, req);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  // The first request's full blocks and its partial last block (a cached
  // tail): everything but the last prompt token, which is always computed.
  EXPECT_EQ(b.last.usage().cached_prompt_tokens(), prompt_tokens - 1);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.text, b.text);
}

// Tenants with different cache salts never share blocks; equal salts do, and
// the prefix-cache counters (in tokens) show the hit.
TEST_F(ServeE2eTest, CacheSaltIsolatesTenantsAndHitsAreCounted) {
  std::string prompt = "Tenant isolation check:";
  for (int i = 0; i < 10; ++i) prompt += " a salted prompt shared by two";
  v1::GenerateRequest req = GreedyRequest(prompt, 4);
  const int prompt_tokens =
      static_cast<int>(Tokenize(*stub_, req.prompt()).size());
  const int cacheable = prompt_tokens - 1;  // full blocks and the tail
  ASSERT_GT(cacheable, 0);
  req.set_cache_salt("tenant-a");
  const StreamResult a = RunGenerate(*stub_, req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.last.usage().cached_prompt_tokens(), 0);
  req.set_cache_salt("tenant-b");
  const StreamResult b = RunGenerate(*stub_, req);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.last.usage().cached_prompt_tokens(), 0) << "crossed tenants";
  req.set_cache_salt("tenant-a");
  const StreamResult c = RunGenerate(*stub_, req);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.last.usage().cached_prompt_tokens(), cacheable);
  EXPECT_EQ(a.tokens, c.tokens);
  EXPECT_TRUE(WaitForMetrics(
      server_->http_port(),
      [&](const auto& m) {
        return Get(m, "kvserve_prefix_cache_hits_tokens_total") >= cacheable &&
               Get(m, "kvserve_prefix_cache_queries_tokens_total") >=
                   3 * cacheable;
      },
      absl::Seconds(10)));
  req.set_cache_salt(std::string(300, 's'));
  const StreamResult d = RunGenerate(*stub_, req);
  EXPECT_EQ(d.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(d.status.error_message().find("cache_salt"), std::string::npos);
}

TEST_F(ServeE2eTest, OnlyTheLastMessageCarriesFinishFields) {
  v1::GenerateRequest req = GreedyRequest("Once upon a time", 24);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  std::vector<v1::GenerateResponse> msgs;
  v1::GenerateResponse m;
  while (reader->Read(&m)) msgs.push_back(m);
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_FALSE(msgs.empty());
  for (size_t i = 0; i + 1 < msgs.size(); ++i) {
    EXPECT_EQ(msgs[i].finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
    EXPECT_FALSE(msgs[i].has_usage());
  }
  EXPECT_TRUE(msgs.back().has_usage());
}

TEST_F(ServeE2eTest, LogprobsArePerTokenWithTopN) {
  v1::GenerateRequest req = GreedyRequest("1, 2, 3,", 4);
  req.mutable_sampling()->set_logprobs(3);
  const StreamResult r = RunGenerate(*stub_, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  // Re-run collecting logprobs from every message.
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  std::vector<v1::TokenLogprobs> lps;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    lps.insert(lps.end(), m.logprobs().begin(), m.logprobs().end());
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(lps.size(), r.tokens.size());
  for (size_t i = 0; i < lps.size(); ++i) {
    EXPECT_EQ(lps[i].token(), r.tokens[i]);
    EXPECT_LE(lps[i].logprob(), 0.0f);
    ASSERT_EQ(lps[i].top_size(), 3);
    EXPECT_EQ(lps[i].top(0).token(), r.tokens[i]);  // greedy = argmax
    EXPECT_FALSE(lps[i].piece().empty());
  }
}

TEST_F(ServeE2eTest, ChatInputGenerates) {
  v1::GenerateRequest req;
  auto* chat = req.mutable_chat();
  auto* msg = chat->add_messages();
  msg->set_role("user");
  msg->set_content("What is the capital of France?");
  req.mutable_sampling()->set_temperature(0);
  req.mutable_sampling()->set_max_tokens(12);
  const StreamResult r = RunGenerate(*stub_, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_FALSE(r.tokens.empty());
  EXPECT_LE(r.tokens.size(), 12u);
  EXPECT_TRUE(r.last.finish_reason() == v1::FINISH_REASON_LENGTH ||
              r.last.finish_reason() == v1::FINISH_REASON_STOP);
  // The chat template adds more than the user's words.
  EXPECT_GT(r.last.usage().prompt_tokens(),
            static_cast<int>(Tokenize(*stub_, msg->content()).size()));
}

TEST_F(ServeE2eTest, TokenizeDetokenizeRoundTrip) {
  const std::string text = "Hello, world! Ünïcödé and 数字 123.";
  const std::vector<int32_t> ids = Tokenize(*stub_, text);
  ASSERT_FALSE(ids.empty());
  grpc::ClientContext ctx;
  v1::DetokenizeRequest req;
  req.mutable_token_ids()->Add(ids.begin(), ids.end());
  req.set_skip_special_tokens(true);
  v1::DetokenizeResponse resp;
  ASSERT_TRUE(stub_->Detokenize(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.text(), text);

  // Control tokens are recognized only when asked for.
  grpc::ClientContext ctx2;
  v1::TokenizeRequest treq;
  treq.set_text("<|im_start|>");
  treq.set_parse_special_tokens(true);
  v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub_->Tokenize(&ctx2, treq, &tresp).ok());
  EXPECT_EQ(tresp.token_ids_size(), 1);
  EXPECT_GT(Tokenize(*stub_, "<|im_start|>").size(), 1u);
}

TEST_F(ServeE2eTest, ModelInfoNumbers) {
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.num_layers(), 30);
  EXPECT_EQ(info.num_heads(), 9);
  EXPECT_EQ(info.num_kv_heads(), 3);
  EXPECT_EQ(info.head_dim(), 64);
  EXPECT_EQ(info.hidden_size(), 576);
  EXPECT_EQ(info.vocab_size(), 49152);
  EXPECT_EQ(info.max_context(), kMaxModelLen);
  EXPECT_EQ(info.block_size(), 16);
  EXPECT_EQ(info.format(), "gguf");
  const absl::StatusOr<kvcache::KvDtype> dtype =
      kvcache::ParseKvDtype(info.kv_dtype());
  ASSERT_TRUE(dtype.ok()) << dtype.status();
  // 2 (K, V) x 30 layers x 3 KV heads x one 64-element row.
  EXPECT_EQ(info.kv_bytes_per_token(),
            2 * 30 * 3 * kvcache::KvRowBytes(*dtype, 64));
  EXPECT_GT(info.num_blocks(), 0);
  EXPECT_LE(int64_t{info.num_blocks()} * info.block_size() *
                info.kv_bytes_per_token(),
            int64_t{128} << 20);
}

struct BadCase {
  const char* name;
  std::function<void(v1::GenerateRequest*)> mutate;
  const char* field;
};

TEST_F(ServeE2eTest, BadInputsAreInvalidArgumentNamingTheField) {
  auto sp = [](v1::GenerateRequest* r) { return r->mutable_sampling(); };
  const std::vector<BadCase> cases = {
      {"no input", [](auto* r) { r->clear_prompt(); }, "input"},
      {"empty prompt", [](auto* r) { r->set_prompt(""); }, "prompt"},
      {"prompt over context",
       [](auto* r) {
         for (int i = 0; i < kMaxModelLen + 10; ++i) {
           r->mutable_prompt_token_ids()->add_ids(100);
         }
       },
       "prompt: "},
      {"unknown token id",
       [](auto* r) { r->mutable_prompt_token_ids()->add_ids(49152); },
       "prompt_token_ids.ids[0]"},
      {"negative token id",
       [](auto* r) { r->mutable_prompt_token_ids()->add_ids(-1); },
       "prompt_token_ids.ids[0]"},
      {"max_tokens 0", [&](auto* r) { sp(r)->set_max_tokens(0); },
       "sampling.max_tokens"},
      {"max_tokens beyond context",
       [&](auto* r) { sp(r)->set_max_tokens(kMaxModelLen); },
       "sampling.max_tokens"},
      {"unknown stop token id",
       [&](auto* r) { sp(r)->add_stop_token_ids(49152); },
       "sampling.stop_token_ids[0]"},
      {"n 17", [](auto* r) { r->set_n(17); }, "n: must be in [1, 16]"},
      {"n -1", [](auto* r) { r->set_n(-1); }, "n: must be in [1, 16]"},
      {"negative temperature", [&](auto* r) { sp(r)->set_temperature(-0.5); },
       "sampling.temperature"},
      {"NaN temperature", [&](auto* r) { sp(r)->set_temperature(NAN); },
       "sampling.temperature"},
      {"top_p 0", [&](auto* r) { sp(r)->set_top_p(0); }, "sampling.top_p"},
      {"top_p 1.5", [&](auto* r) { sp(r)->set_top_p(1.5); }, "sampling.top_p"},
      {"top_k -1", [&](auto* r) { sp(r)->set_top_k(-1); }, "sampling.top_k"},
      {"min_p 2", [&](auto* r) { sp(r)->set_min_p(2); }, "sampling.min_p"},
      {"repetition_penalty 0",
       [&](auto* r) { sp(r)->set_repetition_penalty(0); },
       "sampling.repetition_penalty"},
      {"presence_penalty 3", [&](auto* r) { sp(r)->set_presence_penalty(3); },
       "sampling.presence_penalty"},
      {"frequency_penalty -3",
       [&](auto* r) { sp(r)->set_frequency_penalty(-3); },
       "sampling.frequency_penalty"},
      {"logprobs 21", [&](auto* r) { sp(r)->set_logprobs(21); },
       "sampling.logprobs"},
      {"too many stop strings",
       [&](auto* r) {
         for (int i = 0; i < 17; ++i) sp(r)->add_stop("x");
       },
       "sampling.stop"},
      {"stop string too long",
       [&](auto* r) { sp(r)->add_stop(std::string(257, 'x')); },
       "sampling.stop[0]"},
      {"empty stop string", [&](auto* r) { sp(r)->add_stop(""); },
       "sampling.stop[0]"},
      {"unknown stop token id",
       [&](auto* r) { sp(r)->add_stop_token_ids(1 << 20); },
       "sampling.stop_token_ids[0]"},
      {"invalid UTF-8 prompt", [](auto* r) { r->set_prompt("ab\xff\xfe"); },
       "prompt"},
      {"invalid UTF-8 stop",
       [&](auto* r) {
         sp(r)->add_stop("ok");
         sp(r)->add_stop("\xc3\x28");
       },
       "sampling.stop[1]"},
      {"invalid UTF-8 chat content",
       [](auto* r) {
         auto* m = r->mutable_chat()->add_messages();
         m->set_role("user");
         m->set_content("hi \xed\xa0\x80");  // a UTF-16 surrogate
       },
       "chat.messages[0].content"},
      {"unknown chat role",
       [](auto* r) {
         auto* m = r->mutable_chat()->add_messages();
         m->set_role("wizard");
         m->set_content("hi");
       },
       "chat.messages[0].role"},
      {"empty chat", [](auto* r) { r->mutable_chat(); }, "chat.messages"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    v1::GenerateRequest req = GreedyRequest("Hello", 4);
    c.mutate(&req);
    const StreamResult r = RunGenerate(*stub_, req, absl::Seconds(30));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << r.status.error_message();
    EXPECT_THAT(r.status.error_message(), HasSubstr(std::string(c.field)));
    EXPECT_TRUE(r.tokens.empty());
  }
  // Tokenize and Detokenize validate too.
  grpc::ClientContext ctx;
  v1::TokenizeRequest treq;
  treq.set_text("\xff");
  v1::TokenizeResponse tresp;
  grpc::Status s = stub_->Tokenize(&ctx, treq, &tresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("text"));
  grpc::ClientContext ctx2;
  v1::DetokenizeRequest dreq;
  dreq.add_token_ids(5);
  dreq.add_token_ids(999999);
  v1::DetokenizeResponse dresp;
  s = stub_->Detokenize(&ctx2, dreq, &dresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("token_ids[1]"));
  // The server is unharmed.
  EXPECT_TRUE(RunGenerate(*stub_, GreedyRequest("Hello", 2)).status.ok());
}

TEST_F(ServeE2eTest, DeadlineEndsTheCallAndFreesItsBlocks) {
  // ~500 tokens take seconds; the deadline is far shorter.
  const StreamResult r = RunGenerate(
      *stub_, GreedyRequest("Count to a thousand:", kMaxModelLen - 20),
      absl::Milliseconds(300));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << r.status.error_message();
  std::string scrape;
  EXPECT_TRUE(WaitForMetrics(
      server_->http_port(),
      [](const auto& m) {
        return Get(m, R"(kvserve_requests{state="running"})") == 0 &&
               Get(m, R"(kvserve_kv_blocks{state="active"})") == 0;
      },
      absl::Seconds(10), &scrape))
      << scrape;
}

TEST_F(ServeE2eTest, CancelMidStreamReturnsBlocks) {
  const double cancelled_before =
      Metric(server_->http_port(),
             R"(kvserve_requests_finished_total{reason="cancelled"})");
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(
      &ctx, GreedyRequest("Tell me a long story.", kMaxModelLen - 20));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));  // streaming has begun
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  std::string scrape;
  EXPECT_TRUE(WaitForMetrics(
      server_->http_port(),
      [&](const auto& m) {
        return Get(m, R"(kvserve_requests{state="running"})") == 0 &&
               Get(m, R"(kvserve_kv_blocks{state="active"})") == 0 &&
               Get(m, R"(kvserve_kv_blocks{state="free"})") +
                       Get(m, R"(kvserve_kv_blocks{state="cached"})") ==
                   Get(m, "kvserve_kv_blocks_capacity") &&
               Get(m,
                   R"(kvserve_requests_finished_total{reason="cancelled"})") ==
                   cancelled_before + 1;
      },
      absl::Seconds(10), &scrape))
      << scrape;
}

TEST_F(ServeE2eTest, HealthCheckIsServing) {
  const auto channel = server_->Channel();
  // grpc.health.v1.HealthCheckRequest{service}: field 1; the reply
  // HealthCheckResponse{status = SERVING (1)} is the bytes 08 01.
  auto [status, reply] =
      GenericUnary(channel, "/grpc.health.v1.Health/Check", "");
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply, std::string("\x08\x01", 2));
  const std::string service = "kvserve.v1.KvServe";
  std::tie(status, reply) = GenericUnary(
      channel, "/grpc.health.v1.Health/Check",
      std::string("\x0a") + static_cast<char>(service.size()) + service);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply, std::string("\x08\x01", 2));
}

TEST_F(ServeE2eTest, ReflectionListsTheService) {
  // ServerReflectionRequest{list_services = "*"}: field 7, "*".
  auto [status, reply] = GenericBidiOnce(
      server_->Channel(),
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      std::string("\x3a\x01*", 3));
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_THAT(reply, HasSubstr("kvserve.v1.KvServe"));
  EXPECT_THAT(reply, HasSubstr("grpc.health.v1.Health"));
}

// Reflection v1 (what current grpcurl tries first): services, the file of
// a symbol with its imports, and NOT_FOUND for unknown names, over one
// stream.
TEST_F(ServeE2eTest, ReflectionV1DescribesTheApi) {
  namespace refl = grpc::reflection::v1;
  auto stub = refl::ServerReflection::NewStub(server_->Channel());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->ServerReflectionInfo(&ctx);
  refl::ServerReflectionRequest req;
  refl::ServerReflectionResponse resp;
  req.set_list_services("*");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  std::vector<std::string> names;
  for (const auto& svc : resp.list_services_response().service()) {
    names.push_back(svc.name());
  }
  EXPECT_THAT(names, ::testing::Contains("kvserve.v1.KvServe"));
  EXPECT_THAT(names,
              ::testing::Contains("grpc.reflection.v1.ServerReflection"));
  req.set_file_containing_symbol("kvserve.v1.KvServe.Generate");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  ASSERT_TRUE(resp.has_file_descriptor_response()) << resp.DebugString();
  const auto& files = resp.file_descriptor_response().file_descriptor_proto();
  ASSERT_FALSE(files.empty());
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(files[0]));  // the file, then imports
  EXPECT_EQ(file.name(), "kvserve/v1/kvserve.proto");
  ASSERT_GT(file.service_size(), 0);
  EXPECT_EQ(file.service(0).name(), "KvServe");
  req.set_file_containing_symbol("no.such.Symbol");
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.error_response().error_code(),
            static_cast<int32_t>(grpc::StatusCode::NOT_FOUND));
  // Reflection is open: a large name is refused without being echoed (it
  // came back twice, 2x its size, before).
  req.set_file_containing_symbol(std::string(1 << 20, 'x'));
  ASSERT_TRUE(stream->Write(req));
  ASSERT_TRUE(stream->Read(&resp));
  EXPECT_EQ(resp.error_response().error_code(),
            static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_LT(resp.ByteSizeLong(), 1024u);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServeE2eTest, MetricsHealthAndReady) {
  ASSERT_TRUE(RunGenerate(*stub_, GreedyRequest("Hi", 2)).status.ok());
  // The call's counters are updated after the client has its status (the
  // reactor's OnDone, the engine's end of step): wait for them, do not
  // race them (a scrape right after the call once saw the stream open).
  std::string body;
  ASSERT_TRUE(WaitForMetrics(
      server_->http_port(),
      [](const auto& mm) {
        return Get(mm,
                   R"(kvserve_grpc_requests_total{code="OK",method="Generate"})") >=
                   1 &&
               Get(mm, "kvserve_generation_tokens_total") >= 2;
      },
      absl::Seconds(10), &body))
      << body;
  for (const char* name :
       {"kvserve_kv_blocks{", "kvserve_kv_cache_usage_ratio",
        "kvserve_kv_reserved_slots", "kvserve_kv_reserved_unwritten_slots",
        "kvserve_preemptions_total", "kvserve_prompt_tokens_total",
        "kvserve_generation_tokens_total",
        "kvserve_time_to_first_token_seconds_bucket",
        "kvserve_grpc_requests_total{"}) {
    EXPECT_THAT(body, HasSubstr(name));
  }
  // The three gauges are set one after another by the engine thread, so a
  // scrape racing an update can see a mix; the identity must hold once the
  // update is complete.
  std::string scrape;
  EXPECT_TRUE(WaitForMetrics(
      server_->http_port(),
      [](const auto& mm) {
        return Get(mm, R"(kvserve_kv_blocks{state="active"})") +
                   Get(mm, R"(kvserve_kv_blocks{state="cached"})") +
                   Get(mm, R"(kvserve_kv_blocks{state="free"})") ==
               Get(mm, "kvserve_kv_blocks_capacity");
      },
      absl::Seconds(5), &scrape))
      << scrape;
  EXPECT_EQ(HttpGet(server_->http_port(), "/health").first, 200);
  EXPECT_EQ(HttpGet(server_->http_port(), "/ready").first, 200);
  EXPECT_EQ(HttpGet(server_->http_port(), "/nope").first, 404);
}

TEST_F(ServeE2eTest, PromtoolAcceptsMetrics) {
  if (std::system("command -v promtool >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "promtool not installed (Debian package `prometheus`)";
  }
  ASSERT_TRUE(RunGenerate(*stub_, GreedyRequest("Hi", 2)).status.ok());
  auto [code, body] = HttpGet(server_->http_port(), "/metrics");
  ASSERT_EQ(code, 200);
  const std::string path =
      ::testing::TempDir() + "/kvserve_metrics_" + std::to_string(getpid());
  std::ofstream(path) << body;
  // The vllm:* gauges are the GIE protocol's names, colons included, which
  // promtool's style lint refuses (kv_events_e2e_test.py parses them).
  const std::string cmd =
      "grep -v 'vllm:' " + path + " | promtool check metrics 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  const int rc = pclose(pipe);
  std::remove(path.c_str());
  EXPECT_EQ(rc, 0) << "promtool check metrics:\n" << out;
}

// Own servers: these end the process.

TEST(ServeLifecycleTest, SigtermDrainsAnInFlightStream) {
  auto server = ServerProcess::Start({"--kv-cache-bytes", "64MiB"});
  ASSERT_NE(server, nullptr);
  auto stub = server->Stub();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub->Generate(&ctx, GreedyRequest("Once upon a time", 48));
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  size_t tokens = m.token_ids_size();
  server->Signal(SIGTERM);
  // Logged by the daemon after the engine stopped admitting.
  ASSERT_TRUE(server->WaitForOutput("draining: ", absl::Seconds(10)));
  // New work is refused while draining (or the port is already closed).
  const StreamResult late =
      RunGenerate(*stub, GreedyRequest("Hi", 2), absl::Seconds(10));
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << late.status.error_message();
  // The in-flight stream completes.
  while (reader->Read(&m)) tokens += m.token_ids_size();
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(tokens, 48u);
  EXPECT_EQ(m.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(server->WaitExit(absl::Seconds(30)), std::optional<int>(0))
      << server->Output();
}

TEST(ServeLifecycleTest, DrainTimeoutCancelsWithUnavailable) {
  auto server = ServerProcess::Start(
      {"--kv-cache-bytes", "128MiB", "--drain-timeout", "0.2"});
  ASSERT_NE(server, nullptr);
  auto stub = server->Stub();
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  // ~1000 tokens take seconds; the drain allows 0.2 s.
  auto reader = stub->Generate(&ctx, GreedyRequest("Once upon a time", 1000));
  v1::GenerateResponse m, last;
  ASSERT_TRUE(reader->Read(&m));
  server->Signal(SIGINT);
  while (reader->Read(&m)) last = m;
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(server->WaitExit(absl::Seconds(30)), std::optional<int>(0))
      << server->Output();
}

TEST(ServeLifecycleTest, HelpDocumentsEveryFlagWithItsDefault) {
  FILE* pipe = popen((std::string(kBinary) + " serve --help").c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  EXPECT_EQ(pclose(pipe), 0);
  for (const char* flag :
       {"--model", "--host", "--port", "--metrics-port", "--block-size",
        "--kv-cache-bytes", "--max-num-seqs", "--max-num-batched-tokens",
        "--max-queued-requests", "--max-model-len", "--scheduling-policy",
        "--drain-timeout", "--log-level", "--threads"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
  EXPECT_THAT(out, HasSubstr("default 50051"));
  EXPECT_THAT(out, HasSubstr("default smollm2-135m"));
}

TEST(ServeLifecycleTest, BadFlagExitsTwo) {
  EXPECT_EQ(WEXITSTATUS(std::system(
                (std::string(kBinary) + " --port 70000 2>/dev/null").c_str())),
            2);
  EXPECT_EQ(
      WEXITSTATUS(std::system(
          (std::string(kBinary) + " serve --scheduling-policy lifo 2>/dev/null")
              .c_str())),
      2);
}

}  // namespace
}  // namespace kvserve::server::testing
