// Confinement of model paths to the configured directories
// (ResolverOptions::confine_to_dirs, `kvserve serve --model-dirs`): no
// absolute path outside, no ../ traversal, no symlink leading out (as the
// model or inside a model directory), while names and paths inside resolve.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/loader/model_resolver.h"

namespace kvserve::models {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ModelResolverSecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            (std::string("resolver_sec_") +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() +
             "_" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "models");
    fs::create_directories(root_ / "outside");
    opts_.models_dirs = {(root_ / "models").string()};
    opts_.confine_to_dirs = true;
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Touch(const std::string& rel) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "{}";
    return p.string();
  }
  void ExpectOutside(const std::string& name) {
    absl::StatusOr<std::string> r = ResolveModelPath(name, opts_);
    ASSERT_FALSE(r.ok()) << name << " resolved to " << *r;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << name;
    EXPECT_THAT(r.status().message(),
                HasSubstr("outside the allowed model directories"));
    EXPECT_THAT(r.status().message(), HasSubstr((root_ / "models").string()));
  }

  fs::path root_;
  ResolverOptions opts_;
};

TEST_F(ModelResolverSecurityTest, InsideResolves) {
  const std::string file = Touch("models/m.gguf");
  Touch("models/hf/config.json");
  EXPECT_EQ(*ResolveModelPath("m.gguf", opts_), file);
  EXPECT_EQ(*ResolveModelPath(file, opts_), file);
  EXPECT_EQ(*ResolveModelPath("./hf", opts_), (root_ / "models/hf").string());
  // A symlink that stays inside is fine.
  fs::create_symlink(file, root_ / "models/alias.gguf");
  EXPECT_TRUE(ResolveModelPath("alias.gguf", opts_).ok());
}

TEST_F(ModelResolverSecurityTest, AbsolutePathOutsideIsRefused) {
  ExpectOutside(Touch("outside/x.gguf"));
  ExpectOutside("/etc/passwd");
  ExpectOutside((root_ / "models").string() + "/../outside/x.gguf");
}

TEST_F(ModelResolverSecurityTest, TraversalIsRefused) {
  Touch("outside/x.gguf");
  ExpectOutside("../outside/x.gguf");
  ExpectOutside("../../../../../../../../../etc/passwd");
}

TEST_F(ModelResolverSecurityTest, SymlinkLeadingOutIsRefused) {
  const std::string secret = Touch("outside/secret.gguf");
  fs::create_symlink(secret, root_ / "models/link.gguf");
  ExpectOutside("link.gguf");
  ExpectOutside((root_ / "models/link.gguf").string());
  // A model directory inside whose file points out.
  Touch("models/hf/config.json");
  fs::create_symlink(secret, root_ / "models/hf/model.safetensors");
  ExpectOutside("./hf");
  // A directory symlink leading out.
  Touch("outside/d/config.json");
  fs::create_symlink(root_ / "outside/d", root_ / "models/d");
  ExpectOutside("./d");
}

TEST_F(ModelResolverSecurityTest, UnconfinedKeepsTrustedCommandLinePaths) {
  opts_.confine_to_dirs = false;
  const std::string outside = Touch("outside/x.gguf");
  EXPECT_EQ(*ResolveModelPath(outside, opts_), outside);
}

}  // namespace
}  // namespace kvserve::models
