// safetensors reader, HF -> GGUF tensor names, sharded HF directories, and
// config.json parsing.
#include "models/loader/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "models/dequant.h"
#include "models/loader/hf_config.h"
#include "tests/models/model_writer_testutil.h"

namespace kvserve::models {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::SafetensorsBuilder;
using testing::ScopedTempDir;
using testing::WriteFile;

TEST(SafetensorsTest, ReadsDtypesShapesAndMetadata) {
  ScopedTempDir dir;
  const std::string path = dir.File("m.safetensors");
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<float> b = {0.5f, -0.25f};
  const std::vector<float> c = {3.0f, -1.0f, 0.125f};
  WriteFile(path, SafetensorsBuilder()
                      .AddFloats("a", GgmlType::kF32, {2, 3}, a)
                      .AddFloats("b", GgmlType::kF16, {2}, b)
                      .AddFloats("c", GgmlType::kBF16, {3, 1}, c)
                      .Metadata("format", "pt")
                      .Build());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), path);
  ASSERT_EQ((*f)->tensors().size(), 3u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const SafetensorsTensorInfo* ta = (*f)->Find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->type, GgmlType::kF32);
  EXPECT_THAT(ta->shape, ElementsAre(3, 2));  // ggml order
  EXPECT_EQ(ta->nbytes, 24u);
  EXPECT_EQ(std::memcmp(ta->data, a.data(), 24), 0);
  const SafetensorsTensorInfo* tb = (*f)->Find("b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->type, GgmlType::kF16);
  float y[3];
  ASSERT_TRUE(DequantizeRow(tb->type, tb->data, y, 2).ok());
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[1], -0.25f);
  const SafetensorsTensorInfo* tc = (*f)->Find("c");
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(tc->type, GgmlType::kBF16);
  EXPECT_THAT(tc->shape, ElementsAre(1, 3));
  ASSERT_TRUE(DequantizeRow(tc->type, tc->data, y, 3).ok());
  EXPECT_THAT(y, ElementsAre(3.0f, -1.0f, 0.125f));
  EXPECT_EQ((*f)->Find("d"), nullptr);
}

TEST(SafetensorsTest, HfToGgufNames) {
  const std::pair<const char*, const char*> kCases[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
      {"model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"},
      {"model.layers.12.post_attention_layernorm.weight",
       "blk.12.ffn_norm.weight"},
      {"model.layers.3.self_attn.q_proj.weight", "blk.3.attn_q.weight"},
      {"model.layers.3.self_attn.k_proj.weight", "blk.3.attn_k.weight"},
      {"model.layers.3.self_attn.v_proj.weight", "blk.3.attn_v.weight"},
      {"model.layers.3.self_attn.o_proj.weight", "blk.3.attn_output.weight"},
      {"model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"},
      {"model.layers.3.self_attn.k_proj.bias", "blk.3.attn_k.bias"},
      {"model.layers.3.self_attn.v_proj.bias", "blk.3.attn_v.bias"},
      {"model.layers.79.mlp.gate_proj.weight", "blk.79.ffn_gate.weight"},
      {"model.layers.79.mlp.up_proj.weight", "blk.79.ffn_up.weight"},
      {"model.layers.79.mlp.down_proj.weight", "blk.79.ffn_down.weight"},
  };
  for (const auto& [hf, gguf] : kCases) {
    EXPECT_EQ(HfToGgufName(hf).value_or("<none>"), gguf) << hf;
  }
  for (const char* unmapped :
       {"model.layers.0.self_attn.rotary_emb.inv_freq",
        "model.layers.x.input_layernorm.weight",
        "model.layers..input_layernorm.weight", "model.layers.1",
        "model.embed_tokens.bias", "transformer.wte.weight"}) {
    EXPECT_FALSE(HfToGgufName(unmapped).has_value()) << unmapped;
  }
}

TEST(SafetensorsTest, SingleFileSourceUsesCanonicalNames) {
  ScopedTempDir dir;
  const std::string path = dir.File("model.safetensors");
  WriteFile(path, SafetensorsBuilder()
                      .AddFloats("model.layers.0.self_attn.k_proj.weight",
                                 GgmlType::kBF16, {32, 64},
                                 testing::TestValues(32 * 64, 1))
                      .AddFloats("model.layers.0.self_attn.rotary_emb.inv_freq",
                                 GgmlType::kF32, {8}, testing::TestValues(8, 2))
                      .Build());
  auto src = SafetensorsWeightSource::Open(path);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ((*src)->origin(), path);
  EXPECT_THAT((*src)->Names(),
              ElementsAre("blk.0.attn_k.weight",
                          "model.layers.0.self_attn.rotary_emb.inv_freq"));
  auto k = (*src)->Get("blk.0.attn_k.weight");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->name, "blk.0.attn_k.weight");
  EXPECT_EQ(k->type, GgmlType::kBF16);
  EXPECT_THAT(k->shape, ElementsAre(64, 32));  // [in, out]
  EXPECT_EQ(k->nbytes, 32u * 64 * 2);
  EXPECT_FALSE((*src)->Has("model.layers.0.self_attn.k_proj.weight"));
  auto missing = (*src)->Get("blk.0.attn_q.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr(path + ": missing tensor blk.0.attn_q.weight"));
}

TEST(SafetensorsTest, ShardedDirectoryLoadsByCanonicalName) {
  ScopedTempDir dir;
  testing::TinySpec spec;
  testing::WriteTinyHfDir(dir.path(), spec, /*shards=*/2);
  auto src = SafetensorsWeightSource::Open(dir.path());
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_EQ((*src)->shards().size(), 2u);
  EXPECT_GT((*src)->shards()[0]->tensors().size(), 0u);
  EXPECT_GT((*src)->shards()[1]->tensors().size(), 0u);
  const auto tensors = testing::TinyTensors(spec);
  EXPECT_EQ((*src)->Names().size(), tensors.size());
  for (const testing::TinyTensor& want : tensors) {
    SCOPED_TRACE(want.name);
    auto t = (*src)->Get(want.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->shape, want.shape);
    auto values = DequantizeTensor(*t);
    ASSERT_TRUE(values.ok()) << values.status();
    const std::vector<float> expected = testing::TinyValues(want);
    const bool bf16 = t->type == GgmlType::kBF16;
    for (size_t i = 0; i < expected.size(); ++i) {
      const float e = bf16 ? Bf16ToFp32(Fp32ToBf16(expected[i])) : expected[i];
      ASSERT_EQ((*values)[i], e) << i;
    }
  }
  // Tensors from both shards.
  EXPECT_TRUE((*src)->Has("token_embd.weight"));
  EXPECT_TRUE((*src)->Has("output.weight"));
}

TEST(SafetensorsTest, IndexErrors) {
  ScopedTempDir dir;
  testing::WriteTinyHfDir(dir.path(), {}, /*shards=*/2);
  const std::string index = dir.File("model.safetensors.index.json");
  // A tensor the index puts in a shard that does not hold it.
  WriteFile(index, R"({"weight_map": {
      "model.embed_tokens.weight": "model-00002-of-00002.safetensors"}})");
  auto s = SafetensorsWeightSource::Open(dir.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model.embed_tokens.weight"));
  EXPECT_THAT(s.message(), HasSubstr(index));
  // A shard outside the directory.
  WriteFile(index, R"({"weight_map": {"x": "../evil.safetensors"}})");
  s = SafetensorsWeightSource::Open(dir.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("../evil.safetensors"));
  // A missing shard file.
  WriteFile(index, R"({"weight_map": {"x": "model-00009.safetensors"}})");
  s = SafetensorsWeightSource::Open(dir.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model-00009.safetensors"));
  // Not JSON, no weight_map.
  WriteFile(index, "{\"weight_map\": ");
  s = SafetensorsWeightSource::Open(dir.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(index));
  WriteFile(index, "{\"metadata\": {}}");
  s = SafetensorsWeightSource::Open(dir.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("weight_map"));
  // An empty directory.
  ScopedTempDir empty;
  s = SafetensorsWeightSource::Open(empty.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(empty.path()));
}

TEST(SafetensorsTest, DuplicateCanonicalNames) {
  ScopedTempDir dir;
  const std::vector<float> v(4, 1.0f);
  WriteFile(dir.File("model-00001-of-00002.safetensors"),
            SafetensorsBuilder()
                .AddFloats("model.norm.weight", GgmlType::kF32, {4}, v)
                .Build());
  WriteFile(dir.File("model-00002-of-00002.safetensors"),
            SafetensorsBuilder()
                .AddFloats("model.norm.weight", GgmlType::kF32, {4}, v)
                .Build());
  WriteFile(dir.File("model.safetensors.index.json"),
            R"({"weight_map": {
                "model.norm.weight": "model-00001-of-00002.safetensors",
                "x": "model-00002-of-00002.safetensors"}})");
  auto s = SafetensorsWeightSource::Open(dir.path()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("output_norm.weight"));
  EXPECT_THAT(s.message(), HasSubstr("model-00002-of-00002.safetensors"));
}

// ---- config.json
// ----------------------------------------------------------------

TEST(HfConfigTest, Llama32WithLlama3RopeScaling) {
  auto c = ParseHfConfig(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "_name_or_path": "meta-llama/Llama-3.2-1B",
    "hidden_size": 2048, "intermediate_size": 8192,
    "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0, "tie_word_embeddings": true,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0,
                     "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192,
                     "rope_type": "llama3"},
    "torch_dtype": "bfloat16", "attention_bias": false})",
                         "/x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "meta-llama/Llama-3.2-1B");
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->num_layers, 16);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->intermediate_size, 8192);
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->max_position, 131072);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position, 8192);
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->rope_style, RopeStyle::kHalfSplit);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->weight_dtype_bytes, 2);
}

TEST(HfConfigTest, Qwen2AndMistral) {
  auto q = ParseHfConfig(R"({"model_type": "qwen2", "hidden_size": 896,
    "intermediate_size": 4864, "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06, "sliding_window": 32768,
    "use_sliding_window": false, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "rope_scaling": null})",
                         "q/config.json");
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->head_dim, 64);
  EXPECT_TRUE(q->qkv_bias);
  EXPECT_EQ(q->sliding_window, 0);
  EXPECT_EQ(q->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_FLOAT_EQ(q->rms_norm_eps, 1e-6f);

  auto m = ParseHfConfig(R"({"model_type": "mistral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 32768, "sliding_window": 4096,
    "torch_dtype": "float32"})",
                         "m/config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->sliding_window, 4096);
  EXPECT_FALSE(m->qkv_bias);
  EXPECT_FALSE(m->tied_embeddings);
  EXPECT_FLOAT_EQ(m->rope_theta, 10000.0f);  // default
  EXPECT_EQ(m->weight_dtype_bytes, 4);

  auto l = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 96, "num_attention_heads": 4,
    "num_hidden_layers": 2, "vocab_size": 10, "max_position_embeddings": 64,
    "attention_bias": true, "num_key_value_heads": null,
    "rope_scaling": {"type": "linear", "factor": 2.0}})",
                         "l/config.json");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->num_kv_heads, 4);
  EXPECT_TRUE(l->qkv_bias);
  EXPECT_EQ(l->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ(l->rope_scaling.factor, 2.0f);
}

TEST(HfConfigTest, ErrorsNameFileAndKey) {
  const std::string base = R"("hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 10,
    "max_position_embeddings": 64)";
  struct Case {
    std::string json;
    std::string want;
  };
  const Case cases[] = {
      {"{\"model_type\": \"llama\"", "not a valid JSON object"},
      {"[1, 2]", "not a valid JSON object"},
      {"{\"model_type\": \"gpt2\", " + base + "}", "'gpt2' is not supported"},
      {"{" + base + "}", "model_type"},
      {R"({"model_type": "llama", "hidden_size": 64})", "num_hidden_layers"},
      {"{\"model_type\": \"llama\", \"num_key_value_heads\": \"8\", " + base +
           "}",
       "'num_key_value_heads' is not an integer"},
      {"{\"model_type\": \"llama\", \"num_key_value_heads\": 3, " + base + "}",
       "multiple of num_kv_heads"},
      {"{\"model_type\": \"llama\", \"rope_theta\": -1, " + base + "}",
       "rope_theta"},
      {"{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": "
       "\"yarn\", \"factor\": 4}, " +
           base + "}",
       "'rope_scaling.rope_type' = 'yarn' is not supported"},
      {"{\"model_type\": \"llama\", \"rope_scaling\": {\"rope_type\": "
       "\"llama3\", \"factor\": 8}, " +
           base + "}",
       "rope_scaling.low_freq_factor"},
      {"{\"model_type\": \"llama\", \"torch_dtype\": \"int4\", " + base + "}",
       "torch_dtype"},
  };
  for (const Case& c : cases) {
    auto r = ParseHfConfig(c.json, "/cfg/config.json");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(r.status().message(), HasSubstr("/cfg/config.json")) << c.json;
    EXPECT_THAT(r.status().message(), HasSubstr(c.want)) << c.json;
  }
}

TEST(HfConfigTest, LoadNamesModelAfterDirectory) {
  ScopedTempDir dir;
  testing::TinySpec spec;
  WriteFile(dir.File("tiny-model/config.json"), testing::TinyHfConfig(spec));
  auto c = LoadHfConfig(dir.File("tiny-model/config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "tiny-model");
  EXPECT_EQ(c->num_layers, 2);
  auto missing = LoadHfConfig(dir.File("nope/config.json"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope/config.json"));
}

}  // namespace
}  // namespace kvserve::models
