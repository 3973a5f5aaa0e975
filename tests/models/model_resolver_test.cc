#include "models/loader/model_resolver.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::models {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

class ModelResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            (std::string("resolver_") +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() +
             "_" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
    for (const char* var :
         {"KVSERVE_MODELS_DIR", "HF_HUB_CACHE", "HF_HOME", "HOME"}) {
      const char* v = std::getenv(var);
      saved_env_[var] = v ? std::optional<std::string>(v) : std::nullopt;
    }
  }
  void TearDown() override {
    for (const auto& [var, value] : saved_env_) {
      if (value) {
        setenv(var.c_str(), value->c_str(), 1);
      } else {
        unsetenv(var.c_str());
      }
    }
    fs::remove_all(root_);
  }

  // Creates `rel` (and its parents) under root_ and returns its full path.
  std::string Touch(const std::string& rel) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "{}";
    return p.string();
  }
  std::string Dir(const std::string& rel) {
    fs::create_directories(root_ / rel);
    return (root_ / rel).string();
  }
  std::string Path(const std::string& rel) const {
    return (root_ / rel).string();
  }
  ResolverOptions Opts(std::vector<std::string> dirs,
                       std::string hf = "") const {
    return {.models_dirs = std::move(dirs), .hf_cache_dir = std::move(hf)};
  }

  fs::path root_;
  std::map<std::string, std::optional<std::string>> saved_env_;
};

TEST_F(ModelResolverTest, ExistingExplicitPathsAreReturnedAsIs) {
  const std::string file = Touch("anywhere/custom.gguf");
  const std::string dir = Dir("some/hf-dir");
  EXPECT_EQ(*ResolveModelPath(file, Opts({})), file);
  EXPECT_EQ(*ResolveModelPath(dir, Opts({})), dir);
  // Even a name that is also a preset: a path wins.
  const std::string preset_like = Dir("llama3-70b");
  EXPECT_EQ(*ResolveModelPath(preset_like, Opts({})), preset_like);
}

TEST_F(ModelResolverTest, MissingExplicitPathIsNotFoundNamingIt) {
  const std::string missing = Path("nope/model.gguf");
  absl::StatusOr<std::string> r = ResolveModelPath(missing, Opts({Dir("m")}));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("'" + missing + "' does not exist"),
                    HasSubstr("--model /path/to/file.gguf")));
  r = ResolveModelPath("../not/there", Opts({Dir("m")}));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("'../not/there'"));
  EXPECT_THAT(r.status().message(), Not(HasSubstr(Path("m"))));
}

TEST_F(ModelResolverTest, PresetByExactFileNameBeforePatterns) {
  const std::string dir = Dir("models");
  Touch("models/aaa-smollm2-135m-q8_0.gguf");
  const std::string exact = Touch("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  EXPECT_EQ(*ResolveModelPath("smollm2-135m", Opts({dir})), exact);
  EXPECT_EQ(*ResolveModelPath("SmolLM2", Opts({dir})), exact);
}

TEST_F(ModelResolverTest, PresetByGgufPatternFirstDirectoryWins) {
  const std::string first = Dir("first");
  const std::string second = Dir("second");
  Touch("first/Meta-Llama-3.1-70B-Instruct-Q4_K_M.gguf");  // other preset
  Touch("first/llama-3-70b.notes.txt");
  const std::string hit = Touch("first/Meta-Llama-3-70B-Instruct.Q4_K_M.gguf");
  Touch("second/llama-3-70b.Q8_0.gguf");
  EXPECT_EQ(*ResolveModelPath("llama3-70b", Opts({first, second})), hit);
  EXPECT_EQ(*ResolveModelPath("llama3-70b", Opts({second, first})),
            Path("second/llama-3-70b.Q8_0.gguf"));
  EXPECT_EQ(*ResolveModelPath("llama3.1-70b", Opts({first, second})),
            Path("first/Meta-Llama-3.1-70B-Instruct-Q4_K_M.gguf"));
}

TEST_F(ModelResolverTest, PresetAsHfDirectoryWithConfigJson) {
  const std::string dir = Dir("models");
  Dir("models/llama3-8b");  // no config.json: ignored
  EXPECT_FALSE(ResolveModelPath("llama3-8b", Opts({dir})).ok());
  Touch("models/meta-llama/Meta-Llama-3-8B/config.json");
  EXPECT_EQ(*ResolveModelPath("llama3-8b", Opts({dir})),
            Path("models/meta-llama/Meta-Llama-3-8B"));
  // The canonical repo comes before instruct variants, in either layout.
  Touch("models/Meta-Llama-3-8B-Instruct/config.json");
  EXPECT_EQ(*ResolveModelPath("llama3-8b", Opts({dir})),
            Path("models/meta-llama/Meta-Llama-3-8B"));
  Touch("models/llama3-8b/config.json");
  EXPECT_EQ(*ResolveModelPath("llama3-8b", Opts({dir})),
            Path("models/llama3-8b"));
}

TEST_F(ModelResolverTest, PresetInHfCacheHonoursRefsMain) {
  const std::string hub = Dir("hub");
  const std::string model = "hub/models--Qwen--Qwen2.5-7B-Instruct";
  Touch(model + "/snapshots/aaa/config.json");
  EXPECT_EQ(*ResolveModelPath("qwen2.5-7b", Opts({Dir("empty")}, hub)),
            Path(model + "/snapshots/aaa"));
  Touch(model + "/snapshots/bbb/config.json");
  fs::create_directories(Path(model + "/refs"));
  std::ofstream(Path(model + "/refs/main")) << "bbb\n";
  EXPECT_EQ(*ResolveModelPath("qwen2.5-7b", Opts({}, hub)),
            Path(model + "/snapshots/bbb"));
  // The canonical repo comes before variants.
  Touch("hub/models--Qwen--Qwen2.5-7B/snapshots/ccc/config.json");
  EXPECT_EQ(*ResolveModelPath("qwen2.5-7b", Opts({}, hub)),
            Path("hub/models--Qwen--Qwen2.5-7B/snapshots/ccc"));
  // A models directory hit comes before the HF cache.
  const std::string gguf = Touch("models/qwen2.5-7b-instruct-q4_k_m.gguf");
  EXPECT_EQ(*ResolveModelPath("qwen2.5-7b", Opts({Path("models")}, hub)), gguf);
}

TEST_F(ModelResolverTest, HfRepoIds) {
  const std::string hub = Dir("hub");
  Touch("hub/models--meta-llama--Meta-Llama-3-70B/snapshots/r1/config.json");
  Touch("hub/models--org--custom-model/snapshots/r2/config.json");
  EXPECT_EQ(*ResolveModelPath("meta-llama/Meta-Llama-3-70B", Opts({}, hub)),
            Path("hub/models--meta-llama--Meta-Llama-3-70B/snapshots/r1"));
  EXPECT_EQ(*ResolveModelPath("org/custom-model", Opts({}, hub)),
            Path("hub/models--org--custom-model/snapshots/r2"));
  absl::StatusOr<std::string> r = ResolveModelPath("org/other", Opts({}, hub));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("'org/other' does not exist"),
                    HasSubstr(Path("hub/models--org--other/snapshots/*/"
                                   "config.json"))));
}

TEST_F(ModelResolverTest, BareGgufFileNameSearchedInModelsDirs) {
  const std::string dir = Dir("models");
  const std::string file = Touch("models/my-finetune.Q4_0.gguf");
  EXPECT_EQ(*ResolveModelPath("my-finetune.Q4_0.gguf", Opts({dir})), file);
  absl::StatusOr<std::string> r = ResolveModelPath("other.gguf", Opts({dir}));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(Path("models/other.gguf")));
}

TEST_F(ModelResolverTest, MissingPresetErrorNamesEveryPlaceAndTheFix) {
  const std::string dir = Dir("models");
  const std::string missing_dir = Path("absent");
  const std::string hub = Path("hub");
  absl::StatusOr<std::string> r = ResolveModelPath(
      "Meta-Llama-3-70B-Instruct", Opts({dir, missing_dir}, hub));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  const std::string msg(r.status().message());
  EXPECT_THAT(msg,
              HasSubstr("'Meta-Llama-3-70B-Instruct' (preset llama3-70b)"));
  EXPECT_THAT(msg, HasSubstr("meta-llama/Meta-Llama-3-70B"));
  EXPECT_THAT(msg, HasSubstr(dir + "/*.gguf named like llama-3-70b"));
  EXPECT_THAT(msg, HasSubstr(dir + "/llama3-70b/config.json"));
  EXPECT_THAT(msg, HasSubstr(dir + "/Meta-Llama-3-70B/config.json"));
  EXPECT_THAT(msg, HasSubstr(dir + "/meta-llama/Meta-Llama-3-70B/config.json"));
  EXPECT_THAT(msg, HasSubstr(dir + "/Meta-Llama-3-70B-Instruct/config.json"));
  EXPECT_THAT(msg, HasSubstr(missing_dir + " (directory does not exist)"));
  EXPECT_THAT(msg,
              HasSubstr(hub + "/models--meta-llama--Meta-Llama-3-70B/snapshots"
                              "/*/config.json"));
  EXPECT_THAT(msg, HasSubstr("--model /path/to/file.gguf or an HF directory"));
  EXPECT_THAT(msg, HasSubstr("KVSERVE_MODELS_DIR"));
  EXPECT_THAT(msg, HasSubstr("deploy/setup.sh"));
  r = ResolveModelPath("Llama-3-70B", Opts({dir}));
  EXPECT_THAT(r.status().message(), HasSubstr("model 'llama3-70b' (HF"));
  // The default model's error names its embedded file.
  r = ResolveModelPath("smollm2-135m", Opts({dir}));
  EXPECT_THAT(r.status().message(),
              HasSubstr(dir + "/SmolLM2-135M-Instruct.Q4_1.gguf"));
}

TEST_F(ModelResolverTest, UnknownNameListsPresets) {
  absl::StatusOr<std::string> r = ResolveModelPath("gpt-5", Opts({Dir("m")}));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("unknown model 'gpt-5'"), HasSubstr("llama3-70b"),
                    HasSubstr("smollm2-135m"),
                    HasSubstr("--model /path/to/file.gguf")));
}

TEST_F(ModelResolverTest, RejectsEmptyAndTraversalNames) {
  EXPECT_EQ(ResolveModelPath("", Opts({})).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* name : {"..", "."}) {
    absl::StatusOr<std::string> r = ResolveModelPath(name, Opts({Dir("m")}));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(r.status().message(), HasSubstr("path component"));
  }
  // "." / ".." components never reach the HF cache layout.
  const std::string hub = Dir("hub");
  Touch("hub/models--org--../snapshots/r/config.json");
  for (const char* name : {"org/..", "../x", "./x"}) {
    absl::StatusOr<std::string> r = ResolveModelPath(name, Opts({}, hub));
    ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << name;
    EXPECT_THAT(r.status().message(), Not(HasSubstr("models--"))) << name;
  }
}

TEST_F(ModelResolverTest, DefaultOptionsFollowTheEnvironment) {
  setenv("KVSERVE_MODELS_DIR", "/a:/b::/a", 1);
  setenv("HF_HUB_CACHE", "/hub-cache", 1);
  setenv("HF_HOME", "/hf-home", 1);
  setenv("HOME", "/home/u", 1);
  ResolverOptions o = DefaultResolverOptions();
  EXPECT_THAT(o.models_dirs,
              ElementsAre("/a", "/b", KVSERVE_SOURCE_DIR "/weights",
                          "/home/u/.cache/kvserve/models"));
  EXPECT_EQ(o.hf_cache_dir, "/hub-cache");
  unsetenv("HF_HUB_CACHE");
  EXPECT_EQ(DefaultResolverOptions().hf_cache_dir, "/hf-home/hub");
  unsetenv("HF_HOME");
  EXPECT_EQ(DefaultResolverOptions().hf_cache_dir,
            "/home/u/.cache/huggingface/hub");
  unsetenv("KVSERVE_MODELS_DIR");
  unsetenv("HOME");
  o = DefaultResolverOptions();
  EXPECT_THAT(o.models_dirs, ElementsAre(KVSERVE_SOURCE_DIR "/weights"));
  EXPECT_EQ(o.hf_cache_dir, "");
}

TEST_F(ModelResolverTest, DefaultOptionsResolveThroughEnvOverrides) {
  const std::string dir = Dir("env-models");
  const std::string file = Touch("env-models/tinyllama-1.1b-chat.Q4_0.gguf");
  setenv("KVSERVE_MODELS_DIR", dir.c_str(), 1);
  setenv("HF_HUB_CACHE", Dir("hub").c_str(), 1);
  setenv("HOME", Dir("home").c_str(), 1);
  EXPECT_EQ(*ResolveModelPath("tinyllama"), file);
  absl::StatusOr<std::string> r = ResolveModelPath("llama3-8b");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr(dir), HasSubstr(KVSERVE_SOURCE_DIR "/weights"),
                    HasSubstr(Path("home/.cache/kvserve/models")),
                    HasSubstr(Path("hub/models--meta-llama"))));
}

TEST_F(ModelResolverTest, DefaultModelInRepoWeights) {
  const std::string embedded =
      KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(embedded)) GTEST_SKIP() << "run deploy/setup.sh";
  unsetenv("KVSERVE_MODELS_DIR");
  setenv("HOME", Dir("home").c_str(), 1);
  EXPECT_EQ(*ResolveModelPath("smollm2-135m"), embedded);
}

}  // namespace
}  // namespace kvserve::models
