// GGUF reader, GGUF -> ModelConfig / TokenizerData: the real default model
// and synthetic files written at test time.
#include "models/loader/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "models/loader/gguf_config.h"
#include "tests/models/model_writer_testutil.h"

namespace kvserve::models {
namespace {

using ::testing::ElementsAre;
using testing::GgufBuilder;
using ::testing::HasSubstr;
using testing::ScopedTempDir;
using testing::WriteFile;

const char kModelPath[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";

std::unique_ptr<GgufFile> OpenReal() {
  auto f = GgufFile::Open(kModelPath);
  EXPECT_TRUE(f.ok()) << f.status()
                      << " (run deploy/setup.sh to fetch the model)";
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(GgufRealModelTest, HeaderAndTensors) {
  auto f = OpenReal();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset(), 1785664u);
  EXPECT_EQ(f->metadata().size(), 33u);
  ASSERT_EQ(f->tensors().size(), 272u);
  std::map<GgmlType, int> counts;
  for (const GgufTensorInfo& t : f->tensors()) ++counts[t.type];
  EXPECT_EQ(counts[GgmlType::kQ8_0], 1);
  EXPECT_EQ(counts[GgmlType::kQ4_1], 210);
  EXPECT_EQ(counts[GgmlType::kF32], 61);
  EXPECT_EQ(counts.size(), 3u);

  const GgufTensorInfo* embd = f->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);
  EXPECT_THAT(embd->shape, ElementsAre(576, 49152));
  EXPECT_EQ(embd->nbytes, 49152u * 18 * 34);
  const GgufTensorInfo* k = f->FindTensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->type, GgmlType::kQ4_1);
  EXPECT_THAT(k->shape, ElementsAre(576, 192));
  EXPECT_EQ(k->offset, 33530176u - 1785664u);
  EXPECT_EQ(f->FindTensor("output.weight"), nullptr);
}

TEST(GgufRealModelTest, Metadata) {
  auto f = OpenReal();
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->GetString("general.architecture").value(), "llama");
  EXPECT_EQ(f->GetInt("llama.block_count").value(), 30);
  EXPECT_FLOAT_EQ(f->GetFloat("llama.rope.freq_base").value(), 100000.0f);
  EXPECT_EQ(f->GetBool("tokenizer.ggml.add_bos_token").value(), false);
  EXPECT_THAT(f->GetStringArray("general.languages").value(),
              ElementsAre("en"));
  EXPECT_EQ(f->GetArrayLength("tokenizer.ggml.merges").value(), 48900u);
  const auto missing = f->GetInt("llama.nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("llama.nope"));
  EXPECT_THAT(missing.status().message(), HasSubstr(kModelPath));
  const auto wrong = f->GetInt("general.name");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("general.name"));
}

TEST(GgufRealModelTest, ModelConfig) {
  auto f = OpenReal();
  ASSERT_NE(f, nullptr);
  auto c = ModelConfigFromGguf(*f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->num_layers, 30);
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->num_heads, 9);
  EXPECT_EQ(c->num_kv_heads, 3);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->max_position, 8192);
  EXPECT_FLOAT_EQ(c->rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kNone);
  EXPECT_EQ(c->rope_style, RopeStyle::kInterleaved);
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->weight_dtype_bytes, 2);
}

TEST(GgufRealModelTest, Tokenizer) {
  auto f = OpenReal();
  ASSERT_NE(f, nullptr);
  auto t = TokenizerDataFromGguf(*f);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->model, TokenizerModel::kByteLevelBpe);
  EXPECT_EQ(t->tokens.size(), 49152u);
  EXPECT_EQ(t->token_types.size(), 49152u);
  EXPECT_TRUE(t->scores.empty());
  EXPECT_EQ(t->merges.size(), 48900u);
  EXPECT_EQ(t->tokens[1], "<|im_start|>");
  EXPECT_EQ(t->tokens[2], "<|im_end|>");
  EXPECT_EQ(t->token_types[2], TokenType::kControl);
  EXPECT_EQ(t->token_types[17], TokenType::kNormal);
  EXPECT_EQ(t->bos_id, 1);
  EXPECT_EQ(t->eos_id, 2);
  EXPECT_EQ(t->unk_id, 0);
  EXPECT_EQ(t->pad_id, 2);
  EXPECT_EQ(t->pre, "smollm");
  EXPECT_FALSE(t->add_bos);
  EXPECT_FALSE(t->add_eos);
  EXPECT_FALSE(t->add_space_prefix);
  EXPECT_THAT(t->chat_template, HasSubstr("<|im_start|>"));
  // <|endoftext|> (id 0) is a control end-of-text token; eos (2) excluded.
  EXPECT_THAT(t->extra_eos_ids, ElementsAre(0));
}

TEST(GgufRealModelTest, WeightSourceViewsIntoTheMapping) {
  auto f = OpenReal();
  ASSERT_NE(f, nullptr);
  const size_t size = f->file_size();
  GgufWeightSource src(std::move(f));
  EXPECT_EQ(src.origin(), kModelPath);
  EXPECT_TRUE(src.Has("blk.29.ffn_down.weight"));
  EXPECT_FALSE(src.Has("blk.30.ffn_down.weight"));
  auto t = src.Get("blk.29.ffn_down.weight");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->name, "blk.29.ffn_down.weight");
  EXPECT_EQ(t->type, GgmlType::kQ4_1);
  EXPECT_THAT(t->shape, ElementsAre(1536, 576));
  EXPECT_EQ(t->nbytes, RowBytes(GgmlType::kQ4_1, 1536) * 576);
  const auto* begin = static_cast<const uint8_t*>(t->data);
  const GgufTensorInfo* info = src.file().FindTensor(t->name);
  EXPECT_EQ(begin, info->data);
  EXPECT_LE(info->data + info->nbytes,
            info->data - src.file().data_offset() - info->offset + size);
  auto missing = src.Get("blk.30.ffn_down.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("missing tensor blk.30.ffn_down.weight"));
  EXPECT_THAT(missing.status().message(), HasSubstr(kModelPath));
}

// ---- Synthetic files
// ---------------------------------------------------------

class GgufSyntheticTest : public ::testing::Test {
 protected:
  std::unique_ptr<GgufFile> Write(const GgufBuilder& b) {
    const std::string path = dir_.File("t.gguf");
    WriteFile(path, b.Build());
    auto f = GgufFile::Open(path);
    EXPECT_TRUE(f.ok()) << f.status();
    return f.ok() ? std::move(f).value() : nullptr;
  }
  ScopedTempDir dir_;
};

TEST_F(GgufSyntheticTest, EveryValueType) {
  GgufBuilder b;
  b.Scalar<uint8_t>("u8", 0, 250)
      .Scalar<int8_t>("i8", 1, -7)
      .Scalar<uint16_t>("u16", 2, 65000)
      .Scalar<int16_t>("i16", 3, -30000)
      .U32("u32", 4000000000u)
      .I32("i32", -2000000000)
      .F32("f32", 1.5f)
      .Bool("b", true)
      .Str("s", "h\xC3\xA9llo")
      .Scalar<uint64_t>("u64", 10, uint64_t{1} << 40)
      .Scalar<int64_t>("i64", 11, -(int64_t{1} << 50))
      .Scalar<double>("f64", 12, 0.1)
      .Scalar<uint64_t>("u64_huge", 10, ~uint64_t{0})
      .StrArray("sa", {"a", "", "<|im_end|>"})
      .Array<int32_t>("ia", 5, {1, -2, 3})
      .Array<uint8_t>("u8a", 0, {7, 255})
      .Array<float>("fa", 6, {0.5f, -2.0f})
      .Array<double>("da", 12, {0.25})
      .StrArray("empty", {});
  auto f = Write(b);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->GetInt("u8").value(), 250);
  EXPECT_EQ(f->GetInt("i8").value(), -7);
  EXPECT_EQ(f->GetInt("u16").value(), 65000);
  EXPECT_EQ(f->GetInt("i16").value(), -30000);
  EXPECT_EQ(f->GetInt("u32").value(), 4000000000);
  EXPECT_EQ(f->GetInt("i32").value(), -2000000000);
  EXPECT_EQ(f->GetInt("u64").value(), int64_t{1} << 40);
  EXPECT_EQ(f->GetInt("i64").value(), -(int64_t{1} << 50));
  EXPECT_EQ(f->GetFloat("f32").value(), 1.5);
  EXPECT_EQ(f->GetFloat("f64").value(), 0.1);
  EXPECT_EQ(f->GetFloat("i32").value(), -2000000000.0);
  EXPECT_TRUE(f->GetBool("b").value());
  EXPECT_EQ(f->GetString("s").value(), "h\xC3\xA9llo");
  EXPECT_THAT(f->GetStringArray("sa").value(),
              ElementsAre("a", "", "<|im_end|>"));
  EXPECT_THAT(f->GetIntArray("ia").value(), ElementsAre(1, -2, 3));
  EXPECT_THAT(f->GetIntArray("u8a").value(), ElementsAre(7, 255));
  EXPECT_THAT(f->GetFloatArray("fa").value(), ElementsAre(0.5, -2.0));
  EXPECT_THAT(f->GetFloatArray("da").value(), ElementsAre(0.25));
  EXPECT_TRUE(f->GetStringArray("empty").value().empty());
  EXPECT_EQ(f->GetArrayLength("sa").value(), 3u);
  // Type mismatches and out-of-range values are errors naming the key.
  for (const auto& s :
       {f->GetInt("f32").status(), f->GetInt("u64_huge").status(),
        f->GetString("u8").status(), f->GetBool("u8").status(),
        f->GetFloat("s").status(), f->GetStringArray("ia").status(),
        f->GetIntArray("fa").status(), f->GetFloatArray("sa").status(),
        f->GetArrayLength("u8").status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(dir_.File("t.gguf")));
  }
  EXPECT_THAT(f->GetInt("u64_huge").status().message(), HasSubstr("u64_huge"));
  EXPECT_THAT(f->GetString("u8").status().message(),
              HasSubstr("'u8' is uint8, expected string"));
  // *Or: fallback only when absent.
  EXPECT_EQ(f->GetIntOr("nope", 42).value(), 42);
  EXPECT_EQ(f->GetIntOr("u8", 42).value(), 250);
  EXPECT_FALSE(f->GetIntOr("s", 42).ok());
  EXPECT_EQ(f->GetStringOr("nope", "x").value(), "x");
  EXPECT_EQ(f->GetFloatOr("nope", 2.5).value(), 2.5);
  EXPECT_TRUE(f->GetBoolOr("nope", true).value());
  EXPECT_TRUE(f->Has("sa"));
  EXPECT_FALSE(f->Has("nope"));
  EXPECT_EQ(f->FindKv("nope"), nullptr);
}

TEST_F(GgufSyntheticTest, VersionTwoAndCustomAlignment) {
  GgufBuilder b(/*version=*/2);
  b.set_alignment(64);
  b.U32("general.alignment", 64);
  const std::vector<float> a = {1, 2, 3};
  const std::vector<float> c = {-1.5f, 0.25f, 8, 9, 10, 11};
  b.AddTensor("a", GgmlType::kF32, {3}, a);
  b.AddTensor("c", GgmlType::kF16, {3, 2}, c);
  auto f = Write(b);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  const GgufTensorInfo* ta = f->FindTensor("a");
  const GgufTensorInfo* tc = f->FindTensor("c");
  ASSERT_NE(ta, nullptr);
  ASSERT_NE(tc, nullptr);
  EXPECT_EQ(ta->offset, 0u);
  EXPECT_EQ(tc->offset, 64u);
  EXPECT_EQ(tc->nbytes, 12u);
  EXPECT_EQ(std::memcmp(ta->data, a.data(), 12), 0);
  auto t = f->GetTensor("c");
  ASSERT_TRUE(t.ok());
  EXPECT_THAT(t->shape, ElementsAre(3, 2));
  uint16_t h[6];
  std::memcpy(h, t->data, sizeof(h));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Fp16ToFp32(h[i]), c[i]);
}

TEST_F(GgufSyntheticTest, Qwen2ConfigAndBiases) {
  testing::TinySpec spec;
  spec.arch = "qwen2";
  spec.qkv_bias = true;
  spec.tied = true;
  GgufBuilder b = testing::TinyGguf(spec);
  b.U32("qwen2.attention.key_length", 16)
      .Str("qwen2.rope.scaling.type", "linear")
      .F32("qwen2.rope.scaling.factor", 4.0f)
      .U32("qwen2.rope.scaling.original_context_length", 64)
      .U32("qwen2.attention.sliding_window", 128);
  auto f = Write(b);
  ASSERT_NE(f, nullptr);
  auto c = ModelConfigFromGguf(*f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_EQ(c->name, "tiny");
  EXPECT_EQ(c->rope_style, RopeStyle::kHalfSplit);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->tied_embeddings);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->vocab_size, 40);  // from the token list
  EXPECT_EQ(c->rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 4.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position, 64);
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_EQ(c->weight_dtype_bytes, 4);  // F32 matrices
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
}

TEST_F(GgufSyntheticTest, ConfigDefaultsAndErrors) {
  GgufBuilder b;
  b.Str("general.architecture", "mistral")
      .U32("mistral.block_count", 2)
      .U32("mistral.context_length", 128)
      .U32("mistral.embedding_length", 64)
      .U32("mistral.feed_forward_length", 96)
      .U32("mistral.attention.head_count", 4)
      .U32("mistral.vocab_size", 100);
  auto f = Write(b);
  ASSERT_NE(f, nullptr);
  auto c = ModelConfigFromGguf(*f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(c->num_kv_heads, 4);  // defaults to head_count
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->vocab_size, 100);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->name, "mistral");

  GgufBuilder phi;
  phi.Str("general.architecture", "phi3");
  f = Write(phi);
  ASSERT_NE(f, nullptr);
  auto bad = ModelConfigFromGguf(*f);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("'phi3' is not supported"));

  GgufBuilder missing;
  missing.Str("general.architecture", "llama").U32("llama.block_count", 2);
  f = Write(missing);
  ASSERT_NE(f, nullptr);
  bad = ModelConfigFromGguf(*f);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.status().message(), HasSubstr("llama.embedding_length"));

  GgufBuilder zero = testing::TinyGguf({});
  zero.U32("llama.attention.head_count_kv", 3);  // duplicate key
  const std::string path = dir_.File("dup.gguf");
  WriteFile(path, zero.Build());
  auto dup = GgufFile::Open(path);
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      dup.status().message(),
      HasSubstr("duplicate metadata key 'llama.attention.head_count_kv'"));
}

TEST_F(GgufSyntheticTest, SentencePieceTokenizerDefaults) {
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "llama")
      .StrArray("tokenizer.ggml.tokens",
                {"<unk>", "<s>", "</s>", "\xE2\x96\x81the", "<0x0A>"})
      .Array<float>("tokenizer.ggml.scores", 6, {0, 0, 0, -1.5f, 0})
      .Array<int32_t>("tokenizer.ggml.token_type", 5, {2, 3, 3, 1, 6})
      .Bool("tokenizer.ggml.add_eos_token", true);
  auto f = Write(b);
  ASSERT_NE(f, nullptr);
  auto t = TokenizerDataFromGguf(*f);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->model, TokenizerModel::kSentencePieceBpe);
  EXPECT_EQ(t->bos_id, 1);
  EXPECT_EQ(t->eos_id, 2);
  EXPECT_EQ(t->unk_id, 0);
  EXPECT_EQ(t->pad_id, -1);
  EXPECT_TRUE(t->add_bos);
  EXPECT_TRUE(t->add_eos);
  EXPECT_TRUE(t->add_space_prefix);
  EXPECT_EQ(t->pre, "default");
  EXPECT_THAT(t->scores, ElementsAre(0, 0, 0, -1.5f, 0));
  EXPECT_EQ(t->token_types[4], TokenType::kByte);
  EXPECT_TRUE(t->merges.empty());
  EXPECT_TRUE(t->extra_eos_ids.empty());  // </s> is eos itself
}

TEST_F(GgufSyntheticTest, TokenizerExtraEosAndErrors) {
  GgufBuilder b;
  b.Str("tokenizer.ggml.model", "gpt2")
      .StrArray("tokenizer.ggml.tokens",
                {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                 "<|im_end|>", "x"})
      .Array<int32_t>("tokenizer.ggml.token_type", 5, {3, 3, 3, 1, 1})
      .StrArray("tokenizer.ggml.merges", {"x x"})
      .U32("tokenizer.ggml.eos_token_id", 1);
  auto f = Write(b);
  ASSERT_NE(f, nullptr);
  auto t = TokenizerDataFromGguf(*f);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_id, -1);
  // <|im_end|> is a normal token here, so it does not end generation.
  EXPECT_THAT(t->extra_eos_ids, ElementsAre(2));

  GgufBuilder bad_types;
  bad_types.Str("tokenizer.ggml.model", "gpt2")
      .StrArray("tokenizer.ggml.tokens", {"a", "b"})
      .Array<int32_t>("tokenizer.ggml.token_type", 5, {1})
      .StrArray("tokenizer.ggml.merges", {});
  f = Write(bad_types);
  auto s = TokenizerDataFromGguf(*f).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.token_type"));

  GgufBuilder bad_id;
  bad_id.Str("tokenizer.ggml.model", "gpt2")
      .StrArray("tokenizer.ggml.tokens", {"a", "b"})
      .StrArray("tokenizer.ggml.merges", {})
      .U32("tokenizer.ggml.eos_token_id", 2);
  f = Write(bad_id);
  s = TokenizerDataFromGguf(*f).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.ggml.eos_token_id"));

  GgufBuilder bert;
  bert.Str("tokenizer.ggml.model", "bert");
  f = Write(bert);
  s = TokenizerDataFromGguf(*f).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'bert' is not supported"));
}

}  // namespace
}  // namespace kvserve::models
