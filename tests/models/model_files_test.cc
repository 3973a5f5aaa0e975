// OpenModelFiles and CheckWeights over the real default model, tiny GGUF
// files in every supported weight type, and tiny HF directories.
#include "models/loader/model_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/dequant.h"
#include "tests/models/model_writer_testutil.h"

namespace kvserve::models {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::WriteFile;

const char kModelPath[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(ModelFilesTest, DefaultModel) {
  auto m = OpenModelFiles(kModelPath);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format, "gguf");
  EXPECT_EQ(m->path, kModelPath);
  EXPECT_EQ(m->weights->origin(), kModelPath);
  EXPECT_TRUE(m->tokenizer_json_path.empty());
  EXPECT_EQ(m->config.num_layers, 30);
  EXPECT_EQ(m->config.vocab_size, 49152);
  EXPECT_TRUE(m->config.tied_embeddings);
  EXPECT_EQ(m->tokenizer.tokens.size(), 49152u);
  EXPECT_EQ(m->tokenizer.eos_id, 2);
  EXPECT_TRUE(CheckWeights(m->config, *m->weights).ok());
  auto embd = m->weights->Get("token_embd.weight");
  ASSERT_TRUE(embd.ok());
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);

  // A config that disagrees with the weights: 4 KV heads instead of 3.
  ModelConfig wrong = m->config;
  wrong.num_kv_heads = 4;
  wrong.num_heads = 8;
  absl::Status s = CheckWeights(wrong, *m->weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), std::string("blk.0.attn_q.weight in ") + kModelPath +
                             ": shape [576, 576], expected [576, 512]");
  wrong = m->config;
  wrong.num_layers = 31;
  s = CheckWeights(wrong, *m->weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), std::string(kModelPath) +
                             ": missing tensor blk.30.attn_norm.weight");
  wrong = m->config;
  wrong.tied_embeddings = false;
  s = CheckWeights(wrong, *m->weights);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("missing tensor output.weight"));
}

class TinyGgufTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(TinyGgufTest, OpensChecksAndDequantizes) {
  ScopedTempDir dir;
  testing::TinySpec spec;
  spec.matrix_type = GetParam();
  const std::string path = dir.File("tiny.gguf");
  WriteFile(path, testing::TinyGguf(spec).Build());
  auto m = OpenModelFiles(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format, "gguf");
  EXPECT_EQ(m->config.name, "tiny");
  EXPECT_EQ(m->config.hidden_size, 64);
  EXPECT_EQ(m->config.head_dim, 16);
  EXPECT_EQ(m->config.num_kv_heads, 2);
  EXPECT_EQ(m->config.intermediate_size, 96);
  EXPECT_FALSE(m->config.tied_embeddings);
  EXPECT_EQ(m->config.weight_dtype_bytes, GetParam() == GgmlType::kF32 ? 4 : 2);
  EXPECT_EQ(m->tokenizer.tokens.size(), 40u);
  EXPECT_THAT(m->tokenizer.extra_eos_ids, ElementsAre(0));
  for (const testing::TinyTensor& want : testing::TinyTensors(spec)) {
    SCOPED_TRACE(want.name);
    auto t = m->weights->Get(want.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->shape, want.shape);
    const GgmlType type = want.shape.size() == 2 ? GetParam() : GgmlType::kF32;
    EXPECT_EQ(t->type, type);
    auto values = DequantizeTensor(*t);
    ASSERT_TRUE(values.ok()) << values.status();
    // The bytes written are the reference encoding of the tiny values;
    // dequantizing must give back exactly what the reference decodes to.
    const std::vector<float> original = testing::TinyValues(want);
    const std::string encoded = testing::Encode(type, original);
    ASSERT_EQ(encoded.size(), t->nbytes);
    std::vector<float> expected(original.size());
    ASSERT_TRUE(
        DequantizeRow(type, encoded.data(), expected.data(), expected.size())
            .ok());
    EXPECT_EQ(*values, expected);
    const float tol = type == GgmlType::kF32 ? 0.0f : 0.1f;
    for (size_t i = 0; i < original.size(); ++i) {
      ASSERT_NEAR((*values)[i], original[i], tol) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, TinyGgufTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16,
                                           GgmlType::kBF16, GgmlType::kQ8_0,
                                           GgmlType::kQ4_0, GgmlType::kQ4_1),
                         [](const auto& info) {
                           return std::string(TypeName(info.param));
                         });

TEST(ModelFilesTest, Qwen2BiasesAreChecked) {
  ScopedTempDir dir;
  testing::TinySpec spec;
  spec.arch = "qwen2";
  spec.qkv_bias = true;
  spec.tied = true;
  const std::string path = dir.File("qwen.gguf");
  testing::GgufBuilder b = testing::TinyGguf(spec);
  WriteFile(path, b.Build());
  auto m = OpenModelFiles(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->config.qkv_bias);
  EXPECT_TRUE(m->config.tied_embeddings);
  EXPECT_EQ(m->config.rope_style, RopeStyle::kHalfSplit);
  // Bias of the wrong length.
  b.FindTensor("blk.1.attn_v.bias")->shape = {16};
  b.FindTensor("blk.1.attn_v.bias")->data.resize(16 * 4);
  WriteFile(path, b.Build());
  auto bad = OpenModelFiles(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(),
            "blk.1.attn_v.bias in " + path + ": shape [16], expected [32]");
}

TEST(ModelFilesTest, HfDirectorySingleAndSharded) {
  for (int shards : {1, 3}) {
    SCOPED_TRACE(shards);
    ScopedTempDir dir;
    testing::TinySpec spec;
    testing::WriteTinyHfDir(dir.path(), spec, shards);
    auto m = OpenModelFiles(dir.path());
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->format, "safetensors");
    EXPECT_EQ(m->path, dir.path());
    EXPECT_EQ(m->tokenizer_json_path, dir.File("tokenizer.json"));
    EXPECT_TRUE(m->tokenizer.tokens.empty());
    EXPECT_EQ(m->config.architecture, "llama");
    EXPECT_EQ(m->config.rope_style, RopeStyle::kHalfSplit);
    EXPECT_EQ(m->config.num_layers, 2);
    EXPECT_EQ(m->config.vocab_size, 40);
    EXPECT_EQ(m->weights->origin(), dir.path());
    auto q = m->weights->Get("blk.1.attn_q.weight");
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(q->type, GgmlType::kBF16);
    EXPECT_THAT(q->shape, ElementsAre(64, 64));
    auto norm = m->weights->Get("blk.1.ffn_norm.weight");
    ASSERT_TRUE(norm.ok()) << norm.status();
    EXPECT_EQ(norm->type, GgmlType::kF32);
    const std::vector<float> want =
        testing::TinyValues({"blk.1.ffn_norm.weight", {64}});
    EXPECT_EQ(std::memcmp(norm->data, want.data(), 64 * 4), 0);
  }
}

TEST(ModelFilesTest, SafetensorsFileWithConfigBeside) {
  ScopedTempDir dir;
  testing::TinySpec spec;
  spec.tied = true;
  testing::WriteTinyHfDir(dir.path(), spec, 1);
  auto m = OpenModelFiles(dir.File("model.safetensors"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->format, "safetensors");
  EXPECT_TRUE(m->config.tied_embeddings);
  EXPECT_FALSE(m->weights->Has("output.weight"));
  EXPECT_EQ(m->weights->origin(), dir.File("model.safetensors"));
}

}  // namespace
}  // namespace kvserve::models
