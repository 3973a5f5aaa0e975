// The engine-flag registry (cli/engine_flags.h): the groups a command takes
// are the flags it accepts, the help says each default from the starting
// values, and the parsed values reach the EngineConfig.
#include "cli/engine_flags.h"

#include <string>
#include <vector>

#include "common/cli_args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

absl::Status ParseArgs(CliArgs& args, std::vector<const char*> argv) {
  argv.insert(argv.begin(), "kvserve");
  return args.Parse(static_cast<int>(argv.size()), argv.data());
}

TEST(EngineFlagsTest, HelpSaysTheDefaultsItStartsFrom) {
  engine::EngineConfig defaults;
  defaults.scheduler.max_num_seqs = 123;
  defaults.scheduler.block_size = 32;
  EngineFlags f = EngineFlagsFrom(defaults, "tiny", "sim:h100");
  f.swap_space_bytes = int64_t{3} << 30;
  CliArgs args("test");
  RegisterEngineFlags(&f, kAllEngineFlags, &args);
  const std::string usage = args.Usage();
  EXPECT_THAT(usage, HasSubstr("(default tiny)"));
  EXPECT_THAT(usage, HasSubstr("default sim:h100)"));
  EXPECT_THAT(usage, HasSubstr("most requests running at once (default 123)"));
  EXPECT_THAT(usage, HasSubstr("tokens per KV cache block (default 32; "
                               "whole key groups of 32 for int3 and int2)"));
  EXPECT_THAT(usage, HasSubstr("(default 3GiB; 0 = swapping off)"));
}

TEST(EngineFlagsTest, OnlyTheGroupsRegisteredAreAccepted) {
  EngineFlags f = EngineFlagsFrom(engine::EngineConfig(), "m", "cpu");
  CliArgs args("test");
  RegisterEngineFlags(&f, kModelFlags | kDeviceFlags, &args);
  EXPECT_THAT(args.Usage(), Not(HasSubstr("--max-num-seqs")));
  EXPECT_THAT(args.Usage(), Not(HasSubstr("--sim-speed")));
  const absl::Status s = ParseArgs(args, {"--max-num-seqs", "4"});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

TEST(EngineFlagsTest, ParsedValuesReachTheConfig) {
  EngineFlags f = EngineFlagsFrom(engine::EngineConfig(), "m", "cpu");
  CliArgs args("test");
  RegisterEngineFlags(&f, kAllEngineFlags, &args);
  ASSERT_TRUE(
      ParseArgs(args, {"--device", "sim:h100x2", "--block-size", "8",
                       "--max-num-seqs", "7", "--kv-reservation", "max-length",
                       "--no-prefix-caching", "--swap-space-bytes", "1GiB",
                       "--preemption-mode", "swap", "--kv-cache-dtype", "fp8",
                       "--sim-seed", "9", "--sim-speed", "0"})
          .ok());
  engine::EngineConfig e;
  ASSERT_TRUE(ApplyEngineFlags(f, kAllEngineFlags, &e).ok());
  EXPECT_EQ(e.device, engine::Device::kSim);
  EXPECT_EQ(e.sim.gpu, "h100");
  EXPECT_EQ(e.sim.tp, 2);
  EXPECT_EQ(e.sim.seed, 9u);
  EXPECT_EQ(e.sim.speed, 0.0);
  EXPECT_EQ(e.scheduler.block_size, 8);
  // Not given: the default, rounded up to whole key groups for int2.
  EngineFlags low = EngineFlagsFrom(engine::EngineConfig(), "m", "cpu");
  low.kv_cache_dtype = "int2";
  engine::EngineConfig le;
  ASSERT_TRUE(ApplyEngineFlags(low, kAllEngineFlags, &le).ok());
  EXPECT_EQ(le.scheduler.block_size, 32);
  low.kv_cache_dtype = "int8";
  ASSERT_TRUE(ApplyEngineFlags(low, kAllEngineFlags, &le).ok());
  EXPECT_EQ(le.scheduler.block_size, 16);
  EXPECT_EQ(e.scheduler.max_num_seqs, 7);
  EXPECT_EQ(e.scheduler.kv_reservation, scheduler::KvReservation::kMaxLength);
  EXPECT_FALSE(e.scheduler.enable_prefix_caching);
  EXPECT_EQ(e.scheduler.preemption_mode, scheduler::PreemptionMode::kSwap);
  EXPECT_EQ(e.swap_space_bytes, int64_t{1} << 30);
  EXPECT_EQ(e.kv_cache_dtype, kvcache::KvDtype::kFP8);
}

TEST(EngineFlagsTest, ABadValueNamesItsFlag) {
  for (const char* flag : {"--kv-reservation", "--preemption-mode",
                           "--kv-cache-dtype", "--device"}) {
    EngineFlags f = EngineFlagsFrom(engine::EngineConfig(), "m", "cpu");
    CliArgs args("test");
    RegisterEngineFlags(&f, kAllEngineFlags, &args);
    ASSERT_TRUE(ParseArgs(args, {flag, "bogus"}).ok());
    engine::EngineConfig e;
    const absl::Status s = ApplyEngineFlags(f, kAllEngineFlags, &e);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << flag;
    EXPECT_THAT(s.message(), HasSubstr(flag));
  }
}

}  // namespace
}  // namespace kvserve::cli
