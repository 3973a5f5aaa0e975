// Raw request parsing: a string field with invalid UTF-8 is reported by its
// path as INVALID_ARGUMENT (protobuf alone would refuse the whole message
// and gRPC would answer INTERNAL); valid messages round-trip.
#include "server/wire_codec.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvserve/v1/kvserve.pb.h"

namespace kvserve::server {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Wire(const google::protobuf::Message& m) {
  // Serializing invalid UTF-8 in a proto3 string only logs; the bytes go
  // out as given, as they would from a careless client.
  std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(WireCodecTest, ValidMessageRoundTrips) {
  v1::GenerateRequest req;
  req.set_prompt("héllo");
  req.mutable_sampling()->add_stop("\n");
  req.mutable_sampling()->set_max_tokens(3);
  v1::GenerateRequest parsed;
  ASSERT_TRUE(ParseRequest(Wire(req), &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), req.SerializeAsString());

  grpc::ByteBuffer out;
  ASSERT_TRUE(SerializeResponse(req, &out).ok());
  v1::GenerateRequest again;
  ASSERT_TRUE(ParseRequest(out, &again).ok());
  EXPECT_EQ(again.prompt(), "héllo");
}

TEST(WireCodecTest, InvalidUtf8IsNamedByPath) {
  struct Case {
    std::function<void(v1::GenerateRequest*)> set;
    const char* path;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->set_prompt("a\xff"); }, "prompt"},
      {[](auto* r) {
         r->set_prompt("fine");
         r->mutable_sampling()->add_stop("ok");
         r->mutable_sampling()->add_stop("\xc3\x28");
       },
       "sampling.stop[1]"},
      {[](auto* r) {
         auto* chat = r->mutable_chat();
         chat->add_messages()->set_content("fine");
         chat->add_messages()->set_content("\xed\xa0\x80");
       },
       "chat.messages[1].content"},
      {[](auto* r) { r->mutable_chat()->add_messages()->set_role("\xfe"); },
       "chat.messages[0].role"},
      {[](auto* r) {
         r->set_prompt("x");
         r->set_request_id("id\x80");
       },
       "request_id"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path);
    v1::GenerateRequest req;
    c.set(&req);
    v1::GenerateRequest parsed;
    const absl::Status s = ParseRequest(Wire(req), &parsed);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(std::string(c.path) + ": invalid UTF-8"));
  }
}

TEST(WireCodecTest, GarbageIsInvalidArgument) {
  const std::string garbage = "\x0a\xff\xff\xff\xff\x0f";  // bad length
  grpc::Slice slice(garbage);
  v1::GenerateRequest parsed;
  const absl::Status s = ParseRequest(grpc::ByteBuffer(&slice, 1), &parsed);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("not a valid kvserve.v1.GenerateRequest"));
}

TEST(WireCodecTest, FindInvalidUtf8FieldOnValidInputIsEmpty) {
  v1::TokenizeRequest req;
  req.set_text("ok");
  EXPECT_EQ(FindInvalidUtf8Field(req.SerializeAsString(),
                                 v1::TokenizeRequest::descriptor()),
            "");
}

}  // namespace
}  // namespace kvserve::server
