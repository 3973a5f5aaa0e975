#include "common/field_error.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "gtest/gtest.h"

namespace kvserve {
namespace {

TEST(FieldErrorTest, NamesTheFieldInMessageAndPayload) {
  const absl::Status s = FieldError(absl::StatusCode::kOutOfRange,
                                    "sampling.stop_token_ids[3]", "too big");
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(s.message(), "sampling.stop_token_ids[3]: too big");
  EXPECT_EQ(ErrorField(s), "sampling.stop_token_ids[3]");
  EXPECT_EQ(InvalidFieldError("n", "x").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FieldErrorTest, PlainStatusesNameNoFieldAndPassUnchanged) {
  const absl::Status plain =
      absl::InvalidArgumentError("top_p: looks like one");
  EXPECT_EQ(ErrorField(plain), std::nullopt);
  EXPECT_EQ(ErrorField(absl::OkStatus()), std::nullopt);
  EXPECT_EQ(RenameField(plain, "x"), plain);
  EXPECT_EQ(RenameFieldPath(plain, {{"top_p", "x"}}), plain);
  EXPECT_EQ(RenameField(absl::OkStatus(), "x"), absl::OkStatus());
}

TEST(FieldErrorTest, RenameKeepsCodeProblemAndPayloads) {
  absl::Status s = FieldError(absl::StatusCode::kInvalidArgument,
                              "sampling.top_p", "must be in (0, 1], got 1.5");
  s.SetPayload("type.example/other", absl::Cord("kept"));
  const absl::Status renamed = RenameField(s, "top_p");
  EXPECT_EQ(renamed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(renamed.message(), "top_p: must be in (0, 1], got 1.5");
  EXPECT_EQ(ErrorField(renamed), "top_p");
  EXPECT_EQ(renamed.GetPayload("type.example/other").value_or(absl::Cord()),
            absl::Cord("kept"));
  // The payload survives a second rename.
  const absl::Status again = RenameField(renamed, "--top-p");
  EXPECT_EQ(again.message(), "--top-p: must be in (0, 1], got 1.5");
  EXPECT_EQ(ErrorField(again), "--top-p");
}

TEST(FieldErrorTest, RenamePathMatchesWholeHeads) {
  const FieldRename renames[] = {
      {"sampling.logprobs", "top_logprobs"},
      {"sampling.", ""},
      {"chat", "messages"},
      {"prompt", "prompt[2]"},
  };
  EXPECT_EQ(RenamePath("sampling.logprobs", renames), "top_logprobs");
  EXPECT_EQ(RenamePath("sampling.top_p", renames), "top_p");
  EXPECT_EQ(RenamePath("chat.messages[0].role", renames),
            "messages.messages[0].role");
  EXPECT_EQ(RenamePath("chat", renames), "messages");
  EXPECT_EQ(RenamePath("prompt[3]", renames), "prompt[2][3]");
  // A head is whole: "prompt" is no head of "prompt_token_ids".
  EXPECT_EQ(RenamePath("prompt_token_ids", renames), "prompt_token_ids");
  EXPECT_EQ(RenamePath("chatty", renames), "chatty");
  EXPECT_EQ(RenamePath("n", renames), "n");
}

TEST(FieldErrorTest, RenameFieldPathRendersTheStatus) {
  const absl::Status s = InvalidFieldError("prompt_token_ids[4]", "unknown");
  const absl::Status r =
      RenameFieldPath(s, {{"prompt_token_ids", "prompt_token_ids.ids"}});
  EXPECT_EQ(r.message(), "prompt_token_ids.ids[4]: unknown");
  EXPECT_EQ(ErrorField(r), "prompt_token_ids.ids[4]");
}

}  // namespace
}  // namespace kvserve
