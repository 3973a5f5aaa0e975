#include "common/cli_args.h"

#include "gtest/gtest.h"

namespace kvserve {
namespace {

struct Flags {
  std::string model = "default";
  int64_t n = 4;
  double t = 0.5;
  bool chat = true;
  int64_t bytes = 0;
};

absl::Status ParseInto(Flags& f, std::vector<const char*> argv) {
  CliArgs args("test");
  args.String("model", &f.model, "model");
  args.Int("n", &f.n, "count", 1, 10);
  args.Float("t", &f.t, "temperature", 0.0, 2.0);
  args.Bool("chat", &f.chat, "chat");
  args.Bytes("kv", &f.bytes, "bytes");
  argv.insert(argv.begin(), "prog");
  return args.Parse(static_cast<int>(argv.size()), argv.data());
}

TEST(CliArgsTest, ParsesBothFormsAndNegation) {
  Flags f;
  ASSERT_TRUE(ParseInto(f, {"--model", "x", "--n=7", "--t", "1.5", "--no-chat",
                            "--kv", "2MiB"})
                  .ok());
  EXPECT_EQ(f.model, "x");
  EXPECT_EQ(f.n, 7);
  EXPECT_DOUBLE_EQ(f.t, 1.5);
  EXPECT_FALSE(f.chat);
  EXPECT_EQ(f.bytes, 2 * 1048576);
}

TEST(CliArgsTest, ErrorsNameTheFlagAndTheLimit) {
  Flags f;
  absl::Status s = ParseInto(f, {"--n", "11"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--n"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[1, 10]"), std::string::npos) << s;
  s = ParseInto(f, {"--bogus", "1"});
  EXPECT_NE(s.message().find("unknown flag --bogus"), std::string::npos) << s;
  s = ParseInto(f, {"--model"});
  EXPECT_NE(s.message().find("needs a value"), std::string::npos) << s;
  s = ParseInto(f, {"--kv", "lots"});
  EXPECT_NE(s.message().find("--kv"), std::string::npos) << s;
  s = ParseInto(f, {"stray"});
  EXPECT_NE(s.message().find("unexpected argument"), std::string::npos) << s;
}

TEST(CliArgsTest, ByteSizes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096);
  EXPECT_EQ(*ParseBytes("80GB"), 80'000'000'000);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 1610612736);
  EXPECT_EQ(*ParseBytes(" 512 mib "), 536870912);
  EXPECT_EQ(*ParseBytes("8e3"), 8000);
  for (const char* bad : {"", "GB", "-1", "12XB", "1e30"}) {
    EXPECT_FALSE(ParseBytes(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace kvserve
