#include "cli/cli_generate.h"

#include "common/field_error.h"
#include "gtest/gtest.h"

namespace kvserve::cli {
namespace {

// Validation's proto paths are rendered as the flags that set them.
TEST(GenerateFlagNamesTest, RendersFieldsAsFlags) {
  auto flag = [](const char* field, bool has_system) {
    const absl::Status s =
        ToFlagNames(InvalidFieldError(field, "bad"), has_system);
    EXPECT_EQ(ErrorField(s).value_or("(none)") + ": bad", s.message());
    return std::string(s.message());
  };
  EXPECT_EQ(flag("sampling.max_tokens", false), "--max-tokens: bad");
  EXPECT_EQ(flag("sampling.top_p", false), "--top-p: bad");
  EXPECT_EQ(flag("sampling.repetition_penalty", false),
            "--repetition-penalty: bad");
  EXPECT_EQ(flag("chat.messages[0].content", true), "--system: bad");
  EXPECT_EQ(flag("chat.messages[0].content", false), "--prompt: bad");
  EXPECT_EQ(flag("chat.messages[1].content", true), "--prompt: bad");
  EXPECT_EQ(flag("prompt", false), "--prompt: bad");
  EXPECT_EQ(flag("n", false), "n: bad");
  const absl::Status plain = absl::InvalidArgumentError("sampling.top_p: x");
  EXPECT_EQ(ToFlagNames(plain, false), plain);
}

}  // namespace
}  // namespace kvserve::cli
