// Bearer-token authentication and tenants (server/auth.h, server/tenants.h):
// the token file format (today's one-token lines and tenant fields), the
// Authorization header forms accepted and refused, errors that never carry
// a token, scopes, and the reload.
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
  absl::StatusOr<std::unique_ptr<BearerAuth>> auth = BearerAuth::FromFile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->num_tokens(), 2);
  EXPECT_TRUE((*auth)->Accepts("alpha-1"));
  EXPECT_TRUE((*auth)->Accepts("beta_2"));
  EXPECT_FALSE((*auth)->Accepts("# ops tokens"));
  EXPECT_FALSE((*auth)->Accepts(""));
}

TEST(BearerAuthTest, BadFilesNameTheFlagNotTheToken) {
  EXPECT_THAT(BearerAuth::FromFile("/nonexistent/tokens").status().message(),
              HasSubstr("--auth-token-file: cannot read"));
  const std::string empty = WriteFile("empty", "# nothing\n\n");
  EXPECT_THAT(BearerAuth::FromFile(empty).status().message(),
              HasSubstr("holds no token"));
  std::remove(empty.c_str());
  const std::string bad = WriteFile("bad", "ok\nsecret weight=zero\n");
  const absl::Status s = BearerAuth::FromFile(bad).status();
  std::remove(bad.c_str());
  EXPECT_THAT(s.message(), HasSubstr("line 2"));
  EXPECT_THAT(s.message(), HasSubstr("weight"));
  EXPECT_THAT(s.message(), Not(HasSubstr("secret")));
}

TEST(BearerAuthTest, AuthorizationHeaderForms) {
  absl::StatusOr<std::unique_ptr<BearerAuth>> auth =
      BearerAuth::FromTokens({"s3cret-token"});
  ASSERT_TRUE(auth.ok());
  const BearerAuth& a = **auth;
  EXPECT_TRUE(a.Authenticate("Bearer s3cret-token", true).ok());
  EXPECT_TRUE(a.Authenticate("bearer s3cret-token", true).ok());
  EXPECT_TRUE(a.Authenticate("BEARER  s3cret-token ", true).ok());
  for (const char* bad :
       {"", "Bearer", "Bearer ", "Bearer s3cret-toke", "Bearer s3cret-token2",
        "Basic s3cret-token", "s3cret-token", "Bearers3cret-token"}) {
    const absl::Status s = a.Authenticate(bad, true).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_THAT(s.message(), HasSubstr("authorization")) << bad;
    EXPECT_THAT(s.message(), Not(HasSubstr("s3cret"))) << bad;
  }
  const absl::Status missing = a.Authenticate("", false).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(missing.message(), HasSubstr("missing"));
}

TEST(BearerAuthTest, RejectsUnusableTokens) {
  EXPECT_FALSE(BearerAuth::FromTokens({}).ok());
  EXPECT_FALSE(BearerAuth::FromTokens({""}).ok());
  EXPECT_FALSE(BearerAuth::FromTokens({"a b"}).ok());
  EXPECT_FALSE(BearerAuth::FromTokens({"caf\xc3\xa9"}).ok());
}

// Today's file: every line its own tenant, with a private scope.
TEST(TenantTableTest, OneTokenLinesAreTenantsOfTheirOwn) {
  absl::StatusOr<TenantTable> t =
      TenantTable::Parse("# c\nalpha\n\nbeta\n", {}, "test");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_tokens(), 2);
  ASSERT_EQ(t->num_tenants(), 2);
  TenantRef a = t->Find("alpha");
  TenantRef b = t->Find("beta");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->name, "token-2");
  EXPECT_EQ(b->name, "token-4");
  EXPECT_NE(a->cache_scope, b->cache_scope);
  EXPECT_FALSE(a->scope_shared);
  EXPECT_FALSE(a->admin);
  EXPECT_EQ(t->Find("gamma"), nullptr);
}

TEST(TenantTableTest, FieldsTokensOfOneTenantAndSharedScopes) {
  TenantDefaults d;
  d.limits.priority_min = -3;
  d.limits.priority_max = 3;
  absl::StatusOr<TenantTable> t = TenantTable::Parse(
      "a1 tenant=alice priority=-5..0 weight=3 max_running=8\n"
      "a2 tenant=alice max_queued=16 cache_scope=sys\n"
      "b1 tenant=bob cache_scope=sys max_request_tokens=1000\n"
      "c1 tenant=carol admin\n",
      d, "test");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_tokens(), 4);
  ASSERT_EQ(t->num_tenants(), 3);
  TenantRef a = t->Find("a2");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a, t->Find("a1"));  // one tenant, two tokens
  EXPECT_EQ(a->name, "alice");
  EXPECT_EQ(a->limits.priority_min, -5);
  EXPECT_EQ(a->limits.priority_max, 0);
  EXPECT_EQ(a->limits.weight, 3);
  EXPECT_EQ(a->limits.max_running, 8);
  EXPECT_EQ(a->limits.max_queued, 16);
  EXPECT_EQ(a->cache_scope, "scope:sys");
  EXPECT_TRUE(a->scope_shared);  // alice and bob name it
  TenantRef b = t->Find("b1");
  EXPECT_EQ(b->cache_scope, a->cache_scope);
  EXPECT_EQ(b->limits.max_request_tokens, 1000);
  EXPECT_EQ(b->limits.priority_min, -3);  // the defaults
  TenantRef c = t->Find("c1");
  EXPECT_TRUE(c->admin);
  EXPECT_EQ(c->cache_scope, "tenant:carol");
  EXPECT_FALSE(c->scope_shared);
}

TEST(TenantTableTest, MalformedLinesNameTheLine) {
  for (const auto& [text, want] :
       std::vector<std::pair<std::string, std::string>>{
           {"x tenant=a weight=2\ny tenant=a weight=3\n", "line 2"},
           {"x\nx\n", "the same token as line 1"},
           {"x tenant=token-7\n", "tenant:"},
           {"x tenant=bad/name\n", "tenant:"},
           {"x priority=5..1\n", "priority range"},
           {"x max_running=0\n", "max_running"},
           {"x colour=blue\n", "unknown field 'colour'"},
           {"x admin=yes\n", "expected key=value or 'admin'"},
           {"x cache_scope\n", "expected key=value"},
       }) {
    absl::StatusOr<TenantTable> t = TenantTable::Parse(text, {}, "f");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_THAT(t.status().message(), HasSubstr(want)) << text;
  }
}

TEST(TenantTableTest, PriorityRanges) {
  int32_t lo = 0;
  int32_t hi = 0;
  ASSERT_TRUE(ParsePriorityRange("-10..10", "f", &lo, &hi).ok());
  EXPECT_EQ(lo, -10);
  EXPECT_EQ(hi, 10);
  ASSERT_TRUE(ParsePriorityRange("4", "f", &lo, &hi).ok());
  EXPECT_EQ(lo, 4);
  EXPECT_EQ(hi, 4);
  EXPECT_FALSE(ParsePriorityRange("1..", "f", &lo, &hi).ok());
  EXPECT_FALSE(ParsePriorityRange("a..b", "f", &lo, &hi).ok());
}

TEST(BearerAuthTest, ReloadTakesNewTokensAndKeepsOldOnError) {
  const std::string path = WriteFile("reload", "old-token tenant=a\n");
  absl::StatusOr<std::unique_ptr<BearerAuth>> auth = BearerAuth::FromFile(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<TenantRef> before =
      (*auth)->Authenticate("Bearer old-token", true);
  ASSERT_TRUE(before.ok());
  std::ofstream(path) << "new-token tenant=b weight=2\n";
  ASSERT_TRUE((*auth)->Reload().ok());
  EXPECT_FALSE((*auth)->Accepts("old-token"));
  EXPECT_TRUE((*auth)->Accepts("new-token"));
  EXPECT_EQ((*before)->name, "a");  // a request's tenant outlives the reload
  std::ofstream(path) << "broken weight=-1\n";
  EXPECT_FALSE((*auth)->Reload().ok());
  EXPECT_TRUE((*auth)->Accepts("new-token"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvserve::server
