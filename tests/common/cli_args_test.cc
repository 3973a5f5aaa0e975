#include "common/cli_args.h"

#include <string>
#include <utility>
#include <vector>

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
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases = {
      {{"--n", "11"},
       "invalid value '11' for --n: expected an integer in "
       "[1, 10]"},
      {{"--n=x"},
       "invalid value 'x' for --n: expected an integer in "
       "[1, 10]"},
      {{"--t", "3"},
       "invalid value '3' for --t: expected a number in "
       "[0, 2]"},
      {{"--chat=maybe"},
       "invalid value 'maybe' for --chat: expected true "
       "or false"},
      {{"--chat="}, "invalid value '' for --chat: expected true or false"},
      {{"--kv", "lots"},
       "invalid value 'lots' for --kv: expected a byte "
       "size such as 4096, 512MiB or 80GB"},
      {{"--bogus", "1"},
       "unknown flag '--bogus' (run 'kvserve test "
       "--help')"},
      {{"--no-model"}, "unknown flag '--no-model'"},
      {{"--model"}, "flag --model needs a value (STRING)"},
      {{"stray"},
       "unexpected argument 'stray' (flags start with --; run "
       "'kvserve test --help')"},
      {{"--"}, "unexpected argument '--'"},
      {{"-h"}, "unexpected argument '-h'"},  // no "help" flag registered
  };
  for (const auto& [argv, message] : cases) {
    const absl::Status s = ParseInto(f, argv);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(s.message().find(message), std::string::npos)
        << s << "\nwant: " << message;
  }
  // Parsing stops at the first error, in command-line order.
  EXPECT_NE(ParseInto(f, {"--n", "0", "--bogus"}).message().find("--n"),
            std::string::npos);
}

TEST(CliArgsTest, BoolValues) {
  Flags f;
  for (const char* yes : {"--chat", "--chat=true", "--chat=1", "--chat=yes"}) {
    f.chat = false;
    ASSERT_TRUE(ParseInto(f, {yes}).ok()) << yes;
    EXPECT_TRUE(f.chat) << yes;
  }
  for (const char* no : {"--no-chat", "--chat=false", "--chat=0", "--chat=no",
                         "--no-chat=true"}) {
    f.chat = true;
    ASSERT_TRUE(ParseInto(f, {no}).ok()) << no;
    EXPECT_FALSE(f.chat) << no;
  }
}

TEST(CliArgsTest, CustomFlagsHelpAliasAndUsage) {
  std::string color = "red";
  bool help = false;
  CliArgs args("paint");
  args.Custom("color", "red|blue", "the color (default red)", "red or blue",
              [&](const std::string& v) {
                if (v != "red" && v != "blue") return false;
                color = v;
                return true;
              });
  args.Bool("help", &help, "show this help");
  const char* ok[] = {"kvserve", "--color=blue", "-h"};
  ASSERT_TRUE(args.Parse(3, ok).ok());
  EXPECT_EQ(color, "blue");
  EXPECT_TRUE(help);
  EXPECT_TRUE(args.Seen("color"));
  const char* bad[] = {"kvserve", "--color", "green"};
  const absl::Status s = args.Parse(3, bad);
  EXPECT_EQ(s.message(),
            "invalid value 'green' for --color: expected red or blue");
  EXPECT_EQ(color, "blue");
  EXPECT_EQ(args.Usage(),
            "usage: kvserve paint [flags]\n"
            "  --color red|blue           the color (default red)\n"
            "  --help                     show this help\n");
  args.SetUsageHeader("usage: kvserve paint --color C\nPaints.\n");
  EXPECT_EQ(args.Usage(),
            "usage: kvserve paint --color C\nPaints.\n"
            "  --color red|blue           the color (default red)\n"
            "  --help                     show this help\n");
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
