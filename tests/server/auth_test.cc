// Bearer-token authentication (server/auth.h): the token file format, the
// Authorization header forms accepted and refused, and errors that never
// carry a token.
#include "server/auth.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path =
      ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
  std::ofstream(path) << text;
  return path;
}

TEST(BearerAuthTest, FileSkipsCommentsAndBlankLinesAndTrims) {
  const std::string path =
      WriteFile("tokens", "# ops tokens\n\n  alpha-1  \n\tbeta_2\n# old\n");
  absl::StatusOr<BearerAuth> auth = BearerAuth::FromFile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(auth->num_tokens(), 2);
  EXPECT_TRUE(auth->Accepts("alpha-1"));
  EXPECT_TRUE(auth->Accepts("beta_2"));
  EXPECT_FALSE(auth->Accepts("# ops tokens"));
  EXPECT_FALSE(auth->Accepts(""));
}

TEST(BearerAuthTest, BadFilesNameTheFlagNotTheToken) {
  EXPECT_THAT(BearerAuth::FromFile("/nonexistent/tokens").status().message(),
              HasSubstr("--auth-token-file: cannot read"));
  const std::string empty = WriteFile("empty", "# nothing\n\n");
  EXPECT_THAT(BearerAuth::FromFile(empty).status().message(),
              HasSubstr("holds no token"));
  std::remove(empty.c_str());
  const std::string spaced = WriteFile("spaced", "ok\nsecret with space\n");
  const absl::Status s = BearerAuth::FromFile(spaced).status();
  std::remove(spaced.c_str());
  EXPECT_THAT(s.message(), HasSubstr("line 2"));
  EXPECT_THAT(s.message(), Not(HasSubstr("secret")));
}

TEST(BearerAuthTest, AuthorizationHeaderForms) {
  absl::StatusOr<BearerAuth> auth = BearerAuth::FromTokens({"s3cret-token"});
  ASSERT_TRUE(auth.ok());
  EXPECT_TRUE(auth->CheckAuthorization("Bearer s3cret-token", true).ok());
  EXPECT_TRUE(auth->CheckAuthorization("bearer s3cret-token", true).ok());
  EXPECT_TRUE(auth->CheckAuthorization("BEARER  s3cret-token ", true).ok());
  for (const char* bad :
       {"", "Bearer", "Bearer ", "Bearer s3cret-toke", "Bearer s3cret-token2",
        "Basic s3cret-token", "s3cret-token", "Bearers3cret-token"}) {
    const absl::Status s = auth->CheckAuthorization(bad, true);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_THAT(s.message(), HasSubstr("authorization")) << bad;
    EXPECT_THAT(s.message(), Not(HasSubstr("s3cret"))) << bad;
  }
  const absl::Status missing = auth->CheckAuthorization("", false);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("missing"));
}

TEST(BearerAuthTest, RejectsUnusableTokens) {
  EXPECT_FALSE(BearerAuth::FromTokens({}).ok());
  EXPECT_FALSE(BearerAuth::FromTokens({""}).ok());
  EXPECT_FALSE(BearerAuth::FromTokens({"a b"}).ok());
  EXPECT_FALSE(BearerAuth::FromTokens({"caf\xc3\xa9"}).ok());
}

}  // namespace
}  // namespace kvserve::server
