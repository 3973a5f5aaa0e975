// Malformed model files written at test time: every defect must come back
// as a Status with the right code whose message names the file and the
// tensor or key, never a crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/dequant.h"
#include "models/loader/gguf.h"
#include "models/loader/model_files.h"
#include "models/loader/safetensors.h"
#include "tests/models/model_writer_testutil.h"

namespace kvserve::models {
namespace {

using testing::GgufBuilder;
using ::testing::HasSubstr;
using testing::SafetensorsBuilder;
using testing::ScopedTempDir;
using testing::WriteFile;

class LoaderErrorsTest : public ::testing::Test {
 protected:
  // Writes `bytes` and opens them as GGUF; expects failure.
  absl::Status OpenGguf(const std::string& bytes) {
    WriteFile(path_, bytes);
    auto f = GgufFile::Open(path_);
    return f.ok() ? absl::OkStatus() : f.status();
  }
  absl::Status OpenSafetensors(const std::string& bytes) {
    WriteFile(st_path_, bytes);
    auto f = SafetensorsFile::Open(st_path_);
    return f.ok() ? absl::OkStatus() : f.status();
  }
  void ExpectError(const absl::Status& s, absl::StatusCode code,
                   const std::string& path,
                   std::initializer_list<std::string> parts) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr(path));
    for (const std::string& p : parts) EXPECT_THAT(s.message(), HasSubstr(p));
  }

  ScopedTempDir dir_;
  const std::string path_ = dir_.File("bad.gguf");
  const std::string st_path_ = dir_.File("bad.safetensors");
};

TEST_F(LoaderErrorsTest, GgufEveryTruncationFailsCleanly) {
  const std::string full = testing::TinyGguf({}).Build();
  WriteFile(path_, full);
  auto f = GgufFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status();
  const size_t header_end = (*f)->data_offset();
  f->reset();
  // Every prefix up to the data section, then a sample of the data section:
  // each must fail with a message naming the file.
  for (size_t n = 0; n < full.size(); n += (n < header_end ? 1 : 997)) {
    const absl::Status s = OpenGguf(full.substr(0, n));
    ASSERT_FALSE(s.ok()) << "prefix " << n;
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    ASSERT_THAT(s.message(), HasSubstr(path_)) << "prefix " << n;
  }
  ExpectError(OpenGguf(full.substr(0, full.size() - 1)),
              absl::StatusCode::kInvalidArgument, path_,
              {"output.weight", "past the end of the file"});
  ExpectError(OpenGguf(full.substr(0, 20)), absl::StatusCode::kInvalidArgument,
              path_, {"truncated file"});
}

TEST_F(LoaderErrorsTest, GgufHeader) {
  std::string bytes = testing::TinyGguf({}).Build();
  bytes[0] = 'X';
  ExpectError(OpenGguf(bytes), absl::StatusCode::kInvalidArgument, path_,
              {"bad magic"});
  ExpectError(OpenGguf(GgufBuilder(/*version=*/1).Build()),
              absl::StatusCode::kInvalidArgument, path_, {"version 1"});
  ExpectError(OpenGguf(GgufBuilder(/*version=*/4).Build()),
              absl::StatusCode::kInvalidArgument, path_, {"version 4"});
  // Absurd counts are rejected before anything is allocated.
  std::string counts = GgufBuilder().Str("a", "b").Build();
  std::memset(&counts[8], 0xff, 8);  // tensor count
  ExpectError(OpenGguf(counts), absl::StatusCode::kInvalidArgument, path_,
              {"tensor count"});
  counts = GgufBuilder().Str("a", "b").Build();
  std::memset(&counts[16], 0x7f, 8);  // kv count
  ExpectError(OpenGguf(counts), absl::StatusCode::kInvalidArgument, path_,
              {"metadata count"});
  ExpectError(OpenGguf(""), absl::StatusCode::kInvalidArgument, path_,
              {"empty"});
  auto missing = GgufFile::Open(dir_.File("nope.gguf"));
  ExpectError(missing.status(), absl::StatusCode::kNotFound,
              dir_.File("nope.gguf"), {});
}

TEST_F(LoaderErrorsTest, GgufMetadata) {
  std::string huge;
  testing::Put<uint64_t>(&huge, uint64_t{1} << 60);
  huge += "abc";
  ExpectError(OpenGguf(GgufBuilder().Raw("general.name", 8, huge).Build()),
              absl::StatusCode::kInvalidArgument, path_,
              {"general.name", "string length 1152921504606846976"});
  std::string array;
  testing::Put<uint32_t>(&array, 8);  // of string
  testing::Put<uint64_t>(&array, uint64_t{1} << 62);
  ExpectError(
      OpenGguf(GgufBuilder().Raw("tokenizer.ggml.tokens", 9, array).Build()),
      absl::StatusCode::kInvalidArgument, path_,
      {"tokenizer.ggml.tokens", "array count"});
  array.clear();
  testing::Put<uint32_t>(&array, 6);  // of float32
  testing::Put<uint64_t>(&array, (uint64_t{1} << 62) + 1);
  ExpectError(
      OpenGguf(GgufBuilder().Raw("tokenizer.ggml.scores", 9, array).Build()),
      absl::StatusCode::kInvalidArgument, path_,
      {"tokenizer.ggml.scores", "array count"});
  array.clear();
  testing::Put<uint32_t>(&array, 9);  // nested
  testing::Put<uint64_t>(&array, 0);
  ExpectError(OpenGguf(GgufBuilder().Raw("nested", 9, array).Build()),
              absl::StatusCode::kInvalidArgument, path_,
              {"nested", "nested arrays"});
  ExpectError(OpenGguf(GgufBuilder().Raw("weird", 13, "x").Build()),
              absl::StatusCode::kInvalidArgument, path_,
              {"weird", "unknown value type 13"});
  ExpectError(OpenGguf(GgufBuilder().U32("general.alignment", 24).Build()),
              absl::StatusCode::kInvalidArgument, path_,
              {"general.alignment", "power of two"});
  ExpectError(OpenGguf(GgufBuilder().Str("general.alignment", "x").Build()),
              absl::StatusCode::kInvalidArgument, path_, {"general.alignment"});
}

TEST_F(LoaderErrorsTest, GgufTensorInfos) {
  const std::vector<float> v(64, 1.0f);
  auto one = [&](auto&& mutate) {
    GgufBuilder b;
    b.AddTensor("blk.0.attn_q.weight", GgmlType::kF32, {32, 2}, v);
    b.AddTensor("blk.0.attn_k.weight", GgmlType::kF32, {32, 2}, v);
    mutate(*b.FindTensor("blk.0.attn_k.weight"));
    return OpenGguf(b.Build());
  };
  using T = GgufBuilder::Tensor;
  ExpectError(one([](T& t) { t.offset = 1 << 20; }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "past the end of the file"});
  ExpectError(one([](T& t) { t.offset = ~uint64_t{0} - 31; }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "past the end of the file"});
  ExpectError(one([](T& t) { t.offset = 8; }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "not a multiple of the alignment 32"});
  ExpectError(one([](T& t) { t.type_id = 99; }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "unknown ggml type id 99"});
  ExpectError(one([](T& t) { t.type_id = 4; }),  // removed Q4_2
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "unknown ggml type id 4"});
  ExpectError(one([](T& t) {
                t.shape = {uint64_t{1} << 40, uint64_t{1} << 40};
              }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "overflows"});
  ExpectError(one([](T& t) { t.shape = {~uint64_t{0}}; }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "too large"});
  ExpectError(one([](T& t) {
                t.shape = {1, 1, 1, 1, 1};
              }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "n_dims 5"});
  ExpectError(one([](T& t) { t.shape.clear(); }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "n_dims 0"});
  ExpectError(one([](T& t) {
                t.type_id = 8;
                t.shape = {48, 1};
              }),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.attn_k.weight", "block size 32"});
  ExpectError(one([](T& t) { t.name = "blk.0.attn_q.weight"; }),
              absl::StatusCode::kInvalidArgument, path_,
              {"duplicate tensor 'blk.0.attn_q.weight'"});
}

TEST_F(LoaderErrorsTest, UnsupportedTensorTypeNamesTypeAndTensor) {
  // A 256-wide model (Q8_K blocks hold 256 elements) whose ffn_gate is Q8_K:
  // a type ggml knows (for activations) but kvserve does not read.
  testing::TinySpec wide;
  wide.hidden = 256;
  GgufBuilder b = testing::TinyGguf(wide);
  GgufBuilder::Tensor* gate = b.FindTensor("blk.0.ffn_gate.weight");
  ASSERT_NE(gate, nullptr);
  gate->type_id = 15;
  gate->data = std::string(96 * 292, '\0');
  WriteFile(path_, b.Build());
  // The container is fine...
  auto f = GgufFile::Open(path_);
  ASSERT_TRUE(f.ok()) << f.status();
  auto t = (*f)->GetTensor("blk.0.ffn_gate.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->type, GgmlType::kQ8_K);
  EXPECT_EQ(t->nbytes, 96u * 292);
  ExpectError(DequantizeTensor(*t).status(), absl::StatusCode::kInvalidArgument,
              "", {"blk.0.ffn_gate.weight", "Q8_K"});
  // ...but the model cannot be served.
  ExpectError(OpenModelFiles(path_).status(),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.0.ffn_gate.weight in " + path_ +
               ": unsupported type Q8_K (id 15)"});
  // Tools that only inspect can skip the check.
  auto m = OpenModelFiles(path_, {.check_weights = false});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config.hidden_size, 256);
}

TEST_F(LoaderErrorsTest, MissingTensorAndShapeMismatch) {
  GgufBuilder b = testing::TinyGguf({});
  b.RemoveTensor("blk.1.ffn_up.weight");
  WriteFile(path_, b.Build());
  ExpectError(OpenModelFiles(path_).status(), absl::StatusCode::kNotFound,
              path_, {path_ + ": missing tensor blk.1.ffn_up.weight"});

  b = testing::TinyGguf({});
  GgufBuilder::Tensor* k = b.FindTensor("blk.1.attn_k.weight");
  k->shape = {64, 16};
  k->data.resize(64 * 16 * 4);
  WriteFile(path_, b.Build());
  ExpectError(OpenModelFiles(path_).status(),
              absl::StatusCode::kInvalidArgument, path_,
              {"blk.1.attn_k.weight in " + path_ +
               ": shape [64, 16], expected [64, 32]"});
}

TEST_F(LoaderErrorsTest, SafetensorsHeader) {
  ExpectError(OpenSafetensors("abc"), absl::StatusCode::kInvalidArgument,
              st_path_, {"truncated"});
  SafetensorsBuilder b;
  b.AddFloats("model.norm.weight", GgmlType::kF32, {4}, {1, 2, 3, 4});
  ASSERT_TRUE(OpenSafetensors(b.Build()).ok());
  // Header length beyond the file.
  std::string bytes = b.Build();
  std::memcpy(bytes.data(), "\xff\xff\xff\x00\x00\x00\x00\x00", 8);
  ExpectError(OpenSafetensors(bytes), absl::StatusCode::kInvalidArgument,
              st_path_, {"header length 16777215 exceeds"});
  ExpectError(OpenSafetensors(b.Build("{\"model.norm.weight\": {")),
              absl::StatusCode::kInvalidArgument, st_path_,
              {"not a valid JSON object"});
  ExpectError(OpenSafetensors(b.Build("[1, 2, 3]")),
              absl::StatusCode::kInvalidArgument, st_path_,
              {"not a valid JSON object"});
  ExpectError(OpenSafetensors(b.Build("\xff\xfe")),
              absl::StatusCode::kInvalidArgument, st_path_,
              {"not a valid JSON object"});
}

TEST_F(LoaderErrorsTest, SafetensorsEntries) {
  const std::string data(16, '\0');
  auto open = [&](const std::string& entry) {
    SafetensorsBuilder b;
    b.Add("w", "F32", {4}, data);
    return OpenSafetensors(b.Build("{\"model.norm.weight\": " + entry + "}"));
  };
  ASSERT_TRUE(
      open(R"({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})").ok());
  const std::pair<std::string, std::string> cases[] = {
      {R"({"dtype": "I64", "shape": [2], "data_offsets": [0, 16]})",
       "unsupported dtype 'I64'"},
      {R"({"dtype": "F8_E4M3", "shape": [16], "data_offsets": [0, 16]})",
       "unsupported dtype 'F8_E4M3'"},
      {R"({"dtype": "F32", "shape": [5], "data_offsets": [0, 20]})",
       "outside the data section"},
      {R"({"dtype": "F32", "shape": [4], "data_offsets": [16, 0]})",
       "outside the data section"},
      {R"({"dtype": "F32", "shape": [3], "data_offsets": [0, 16]})",
       "shape x dtype needs 12"},
      {R"({"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]})",
       "'shape'"},
      {R"({"dtype": "F32", "shape": [4294967296, 4294967296],
           "data_offsets": [0, 16]})",
       "overflows"},
      {R"({"dtype": "F32", "shape": [4], "data_offsets": [0]})",
       "data_offsets"},
      {R"({"shape": [4], "data_offsets": [0, 16]})", "dtype"},
      {R"("F32")", "not an object"},
  };
  for (const auto& [entry, want] : cases) {
    ExpectError(open(entry), absl::StatusCode::kInvalidArgument, st_path_,
                {"model.norm.weight", want});
  }
}

TEST_F(LoaderErrorsTest, HfDirectories) {
  ScopedTempDir hf;
  testing::WriteTinyHfDir(hf.path(), {}, /*shards=*/1);
  ASSERT_TRUE(OpenModelFiles(hf.path()).ok());
  std::filesystem::remove(hf.File("config.json"));
  ExpectError(OpenModelFiles(hf.path()).status(), absl::StatusCode::kNotFound,
              hf.path(), {"config.json"});
  WriteFile(hf.File("config.json"), "{\"model_type\": \"llama\"}");
  ExpectError(OpenModelFiles(hf.path()).status(),
              absl::StatusCode::kInvalidArgument, hf.File("config.json"),
              {"num_hidden_layers"});
  // Untied config, no lm_head in the checkpoint.
  testing::TinySpec tied;
  tied.tied = true;
  ScopedTempDir hf2;
  testing::WriteTinyHfDir(hf2.path(), tied, 1);
  WriteFile(hf2.File("config.json"), testing::TinyHfConfig({}));
  ExpectError(OpenModelFiles(hf2.path()).status(), absl::StatusCode::kNotFound,
              hf2.path(), {"missing tensor output.weight"});
  ExpectError(OpenModelFiles(dir_.File("nothing")).status(),
              absl::StatusCode::kNotFound, dir_.File("nothing"), {});
}

}  // namespace
}  // namespace kvserve::models
