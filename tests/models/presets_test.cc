#include "models/loader/presets.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvserve::models {
namespace {

using ::testing::HasSubstr;

// One expected row, from the model's published config.json: architecture
// numbers, KV bytes per token (bf16) and the parameter count from shapes.
struct Expected {
  const char* name;
  int layers, hidden, heads, kv_heads, head_dim, inter, vocab, max_pos;
  float rope_theta, eps;
  bool tied, qkv_bias;
  int sliding_window;
  int64_t kv_bytes_per_token;
  int64_t params;
};

const Expected kTable[] = {
    {"llama2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, 1e4f, 1e-5f, false,
     false, 0, 524288, 6738415616},
    {"llama2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096, 1e4f, 1e-5f,
     false, false, 0, 819200, 13015864320},
    {"llama2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096, 1e4f, 1e-5f, false,
     false, 0, 327680, 68976648192},
    {"llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192, 5e5f, 1e-5f, false,
     false, 0, 131072, 8030261248},
    {"llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256, 8192, 5e5f, 1e-5f,
     false, false, 0, 327680, 70553706496},
    {"llama3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072, 5e5f, 1e-5f,
     false, false, 0, 131072, 8030261248},
    {"llama3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072, 5e5f, 1e-5f,
     false, false, 0, 327680, 70553706496},
    {"llama3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, 131072, 5e5f,
     1e-5f, false, false, 0, 516096, 405853388800},
    {"llama3.2-1b", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 5e5f, 1e-5f,
     true, false, 0, 32768, 1235814400},
    {"llama3.2-3b", 28, 3072, 24, 8, 128, 8192, 128256, 131072, 5e5f, 1e-5f,
     true, false, 0, 114688, 3212749824},
    {"mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768, 1e4f, 1e-5f,
     false, false, 4096, 131072, 7241732096},
    {"mistral-7b-v0.3", 32, 4096, 32, 8, 128, 14336, 32768, 32768, 1e6f, 1e-5f,
     false, false, 0, 131072, 7248023552},
    {"qwen2.5-0.5b", 24, 896, 14, 2, 64, 4864, 151936, 32768, 1e6f, 1e-6f, true,
     true, 0, 12288, 494032768},
    {"qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 131072, 1e6f, 1e-6f,
     false, true, 0, 57344, 7615616512},
    {"qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, 131072, 1e6f, 1e-5f,
     false, true, 0, 327680, 72706203648},
    {"smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 8192, 1e5f, 1e-5f, true,
     false, 0, 23040, 134515008},
    {"smollm2-360m", 32, 960, 15, 5, 64, 2560, 49152, 8192, 1e5f, 1e-5f, true,
     false, 0, 40960, 361821120},
    {"smollm2-1.7b", 24, 2048, 32, 32, 64, 8192, 49152, 8192, 1.3e5f, 1e-5f,
     true, false, 0, 196608, 1711376384},
    {"tinyllama-1.1b", 22, 2048, 32, 4, 64, 5632, 32000, 2048, 1e4f, 1e-5f,
     false, false, 0, 22528, 1100048384},
};

TEST(PresetsTest, EveryModelsMdRowMatches) {
  for (const Expected& e : kTable) {
    SCOPED_TRACE(e.name);
    const ModelPreset* p = FindPreset(e.name);
    ASSERT_NE(p, nullptr);
    const ModelConfig& c = p->config;
    EXPECT_EQ(p->name, e.name);
    EXPECT_EQ(c.name, e.name);
    EXPECT_EQ(c.num_layers, e.layers);
    EXPECT_EQ(c.hidden_size, e.hidden);
    EXPECT_EQ(c.num_heads, e.heads);
    EXPECT_EQ(c.num_kv_heads, e.kv_heads);
    EXPECT_EQ(c.head_dim, e.head_dim);
    EXPECT_EQ(c.head_dim * c.num_heads, c.hidden_size);
    EXPECT_EQ(c.intermediate_size, e.inter);
    EXPECT_EQ(c.vocab_size, e.vocab);
    EXPECT_EQ(c.max_position, e.max_pos);
    EXPECT_FLOAT_EQ(c.rope_theta, e.rope_theta);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, e.eps);
    EXPECT_EQ(c.tied_embeddings, e.tied);
    EXPECT_EQ(c.qkv_bias, e.qkv_bias);
    EXPECT_EQ(c.sliding_window, e.sliding_window);
    EXPECT_EQ(c.rope_style, RopeStyle::kHalfSplit);
    EXPECT_EQ(c.weight_dtype_bytes, 2);
    EXPECT_TRUE(c.Validate().ok());
    EXPECT_EQ(kvcache::KvBytesPerToken(KvShapeOf(c), kvcache::KvDtype::kBF16),
              e.kv_bytes_per_token);
    EXPECT_EQ(EstimateParameterCount(c), e.params);
  }
  EXPECT_EQ(ListPresets().size(), std::size(kTable));
}

TEST(PresetsTest, RopeScalingFactorsComeFromTheConfigs) {
  for (const char* name : {"llama3.1-8b", "llama3.1-70b", "llama3.1-405b"}) {
    const RopeScaling& s = FindPreset(name)->config.rope_scaling;
    EXPECT_EQ(s.type, RopeScalingType::kLlama3) << name;
    EXPECT_FLOAT_EQ(s.factor, 8.0f) << name;
    EXPECT_FLOAT_EQ(s.low_freq_factor, 1.0f) << name;
    EXPECT_FLOAT_EQ(s.high_freq_factor, 4.0f) << name;
    EXPECT_EQ(s.original_max_position, 8192) << name;
  }
  for (const char* name : {"llama3.2-1b", "llama3.2-3b"}) {
    const RopeScaling& s = FindPreset(name)->config.rope_scaling;
    EXPECT_EQ(s.type, RopeScalingType::kLlama3) << name;
    EXPECT_FLOAT_EQ(s.factor, 32.0f) << name;
  }
  for (const char* name : {"llama2-70b", "llama3-70b", "mistral-7b",
                           "qwen2.5-7b", "smollm2-135m", "tinyllama-1.1b"}) {
    EXPECT_EQ(FindPreset(name)->config.rope_scaling.type,
              RopeScalingType::kNone)
        << name;
  }
}

TEST(PresetsTest, HfReposAndArchitectures) {
  EXPECT_EQ(FindPreset("llama3-70b")->hf_repo, "meta-llama/Meta-Llama-3-70B");
  EXPECT_EQ(FindPreset("llama2-70b")->hf_repo, "meta-llama/Llama-2-70b-hf");
  EXPECT_EQ(FindPreset("smollm2-135m")->hf_repo, "HuggingFaceTB/SmolLM2-135M");
  EXPECT_EQ(FindPreset("qwen2.5-7b")->config.architecture, "qwen2");
  EXPECT_EQ(FindPreset("mistral-7b")->config.architecture, "mistral");
  EXPECT_EQ(FindPreset("llama3.2-1b")->config.architecture, "llama");
  EXPECT_EQ(FindPreset("llama3-8b")->chat_format, ChatFormat::kLlama3);
  EXPECT_EQ(FindPreset("smollm2-135m")->chat_format, ChatFormat::kChatML);
  EXPECT_THAT(FindPreset("smollm2-135m")->file_names,
              ::testing::ElementsAre("SmolLM2-135M-Instruct.Q4_1.gguf"));
  for (const ModelPreset& p : ListPresets()) {
    SCOPED_TRACE(p.name);
    EXPECT_EQ(FindPreset(p.name), &p);
    for (const std::string& repo : p.AllHfRepos()) {
      EXPECT_EQ(std::count(repo.begin(), repo.end(), '/'), 1) << repo;
      EXPECT_EQ(FindPreset(repo), &p) << repo;
    }
    EXPECT_FALSE(p.gguf_patterns.empty());
  }
}

TEST(PresetsTest, FindPresetIsCaseAndSeparatorInsensitive) {
  const ModelPreset* l3 = FindPreset("llama3-70b");
  ASSERT_NE(l3, nullptr);
  for (const char* alias :
       {"LLAMA3-70B", "llama-3-70b", "Llama_3_70B", "Meta-Llama-3-70B",
        "meta-llama/Meta-Llama-3-70B", "Meta-Llama-3-70B-Instruct",
        "llama3-70b-instruct"}) {
    EXPECT_EQ(FindPreset(alias), l3) << alias;
  }
  EXPECT_EQ(FindPreset("llama-3.1-8b-instruct"), FindPreset("llama3.1-8b"));
  EXPECT_EQ(FindPreset("Meta-Llama-3.1-8B"), FindPreset("llama3.1-8b"));
  EXPECT_EQ(FindPreset("Llama-2-7b-chat-hf"), FindPreset("llama2-7b"));
  EXPECT_EQ(FindPreset("mistral-7b-v0.1"), FindPreset("mistral-7b"));
  EXPECT_EQ(FindPreset("Mistral-7B-Instruct-v0.3"),
            FindPreset("mistral-7b-v0.3"));
  EXPECT_EQ(FindPreset("smollm2"), FindPreset("smollm2-135m"));
  EXPECT_EQ(FindPreset("SmolLM2-135M-Instruct"), FindPreset("smollm2-135m"));
  EXPECT_EQ(FindPreset("tinyllama"), FindPreset("tinyllama-1.1b"));
  EXPECT_EQ(FindPreset("Qwen/Qwen2.5-0.5B-Instruct"),
            FindPreset("qwen2.5-0.5b"));
}

TEST(PresetsTest, SimilarNamesStayDistinct) {
  EXPECT_NE(FindPreset("llama3-8b"), FindPreset("llama3.1-8b"));
  EXPECT_NE(FindPreset("llama2-7b"), FindPreset("llama2-70b"));
  EXPECT_NE(FindPreset("qwen2.5-7b"), FindPreset("qwen2.5-72b"));
  EXPECT_NE(FindPreset("mistral-7b"), FindPreset("mistral-7b-v0.3"));
  for (const char* unknown :
       {"", "gpt2", "llama4-8b", "llama3-13b", "..", "instruct", "-"}) {
    EXPECT_EQ(FindPreset(unknown), nullptr) << unknown;
  }
}

// Names of the presets whose gguf patterns match `file`.
std::vector<std::string> Matching(const std::string& file) {
  std::vector<std::string> names;
  for (const ModelPreset& p : ListPresets()) {
    if (p.MatchesGgufFileName(file)) names.push_back(p.name);
  }
  return names;
}

TEST(PresetsTest, GgufFileNamesMatchExactlyOnePreset) {
  using ::testing::ElementsAre;
  EXPECT_THAT(Matching("SmolLM2-135M-Instruct.Q4_1.gguf"),
              ElementsAre("smollm2-135m"));
  EXPECT_THAT(Matching("Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"),
              ElementsAre("llama3.1-8b"));
  EXPECT_THAT(Matching("Meta-Llama-3-8B-Instruct.Q8_0.GGUF"),
              ElementsAre("llama3-8b"));
  EXPECT_THAT(Matching("llama-2-70b.Q4_0.gguf"), ElementsAre("llama2-70b"));
  EXPECT_THAT(Matching("llama-2-7b-chat.Q4_0.gguf"), ElementsAre("llama2-7b"));
  EXPECT_THAT(Matching("qwen2.5-7b-instruct-q4_k_m.gguf"),
              ElementsAre("qwen2.5-7b"));
  EXPECT_THAT(Matching("Qwen2.5-72B-Instruct-Q4_K_M.gguf"),
              ElementsAre("qwen2.5-72b"));
  EXPECT_THAT(Matching("mistral-7b-instruct-v0.3.Q4_K_M.gguf"),
              ElementsAre("mistral-7b-v0.3"));
  EXPECT_THAT(Matching("mistral-7b-v0.1.Q4_K_M.gguf"),
              ElementsAre("mistral-7b"));
  EXPECT_THAT(Matching("tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf"),
              ElementsAre("tinyllama-1.1b"));
  EXPECT_THAT(Matching("Llama-3.2-1B-Instruct-Q4_K_M.gguf"),
              ElementsAre("llama3.2-1b"));
  EXPECT_TRUE(Matching("llama-3-70b.safetensors").empty());
  EXPECT_TRUE(Matching("gpt2.gguf").empty());
}

TEST(PresetsTest, NamesAndNormalization) {
  EXPECT_EQ(NormalizeModelName("Llama-3.1-8B"), "llama318b");
  EXPECT_EQ(NormalizeModelName("Qwen_2.5 7B"), "qwen257b");
  const std::string names = PresetNames();
  for (const Expected& e : kTable) EXPECT_THAT(names, HasSubstr(e.name));
  EXPECT_THAT(names, HasSubstr("llama2-7b, llama2-13b"));
  const kvcache::KvShape s = KvShapeOf(FindPreset("llama3-70b")->config);
  EXPECT_EQ(s.num_layers, 80);
  EXPECT_EQ(s.num_kv_heads, 8);
  EXPECT_EQ(s.head_dim, 128);
}

}  // namespace
}  // namespace kvserve::models
