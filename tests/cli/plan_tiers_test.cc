// `kvserve plan`'s tiers section (cli/plan_tiers.h): tokens and sequences a
// tier's bytes hold (with the stored block's header and padding), the load
// time per token at the tier's rate against recompute, and the warning for
// a tier predicted slower than recomputing.
#include "cli/plan_tiers.h"

#include <string>
#include <vector>

#include "cli/cli_plan.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string PlanOut(const std::vector<std::string>& args) {
  std::string out, err;
  EXPECT_EQ(RunPlan(args, nullptr, &out, &err), 0) << err;
  return out;
}

TEST(PlanTiersTest, TokensSequencesAndRatesAgainstTheRoofline) {
  // Llama-3-8B bf16: 131,072 bytes a token, 2 MiB a block of 16, stored
  // with a 4 KiB header: 2,101,248 bytes.
  const std::string out =
      PlanOut({"--model", "llama3-8b", "--gpu", "h100", "--context", "8192",
               "--host-cache-bytes", "256GiB", "--disk-cache-bytes", "1TiB",
               "--disk-read-gbps", "2"});
  EXPECT_THAT(out, HasSubstr("host tier        256.0 GiB: 2097152 tokens, "
                             "256 sequences at --context (2097152 bytes"));
  EXPECT_THAT(out, HasSubstr("disk tier        1024.0 GiB: 8372240 tokens, "
                             "1022 sequences at --context (2101248 bytes"));
  // 2,101,248 / 16 bytes a token at 2 GB/s: 65.664 ms per 1K tokens, above
  // the H100 roofline's prefill: flagged.
  EXPECT_THAT(out, HasSubstr("load 65.664 ms per 1K tokens at 2.00 GB/s"));
  EXPECT_THAT(out, HasSubstr("SLOWER than recompute"));
  // The host link (64 GB/s) is not.
  EXPECT_THAT(out, HasSubstr("at 64.00 GB/s vs recompute"));
  EXPECT_THAT(out, Not(HasSubstr("remote tier")));
}

TEST(PlanTiersTest, MeasuredPrefillRateWithoutAGpu) {
  const std::string out = PlanOut(
      {"--model", "llama3-8b", "--kv-dtype", "int8", "--disk-cache-bytes",
       "10GiB", "--prefill-tokens-per-second", "500", "--json"});
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["tiers"].size(), 1u);
  const nlohmann::json& t = j["tiers"][0];
  EXPECT_EQ(t["name"], "disk");
  EXPECT_DOUBLE_EQ(t["recompute_seconds_per_token"].get<double>(), 0.002);
  EXPECT_FALSE(t["slower_than_recompute"].get<bool>());
  EXPECT_GT(t["tokens"].get<int64_t>(), 0);
}

TEST(PlanTiersTest, UnknownRecomputeIsSaidNotGuessed) {
  const std::string out =
      PlanOut({"--model", "llama3-8b", "--remote-cache-bytes", "1GiB"});
  EXPECT_THAT(out, HasSubstr("remote tier"));
  EXPECT_THAT(out, HasSubstr("recompute unknown"));
  EXPECT_THAT(out, Not(HasSubstr("SLOWER")));
  // No tier flags: no section.
  EXPECT_THAT(PlanOut({"--model", "llama3-8b"}), Not(HasSubstr(" tier ")));
}

}  // namespace
}  // namespace kvserve::cli
