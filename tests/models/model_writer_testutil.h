// Test-only writers for model files: a GGUF byte builder (valid files and
// deliberately malformed ones), a safetensors builder, reference quantizers,
// a tiny Llama-shaped model in GGUF and HF layouts, and a scoped temp dir.
// Header-only so that each *_test.cc executable can include it.
#pragma once

#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "models/ggml_types.h"
#include "nlohmann/json.hpp"

namespace kvserve::models::testing {

// ---- Bytes ------------------------------------------------------------------

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out->append(b, sizeof(T));
}

inline void PutStr(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

inline std::string FloatBytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

inline std::string HalfBytes(const std::vector<float>& v, bool bf16) {
  std::string out;
  for (float f : v) Put<uint16_t>(&out, bf16 ? Fp32ToBf16(f) : Fp32ToFp16(f));
  return out;
}

// Deterministic values in [-scale, scale), seeded by `seed`.
inline std::vector<float> TestValues(int64_t n, uint64_t seed,
                                     float scale = 1.0f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v[i] =
        scale * (static_cast<float>((s >> 40) & 0xffffff) / 8388608.0f - 1.0f);
  }
  return v;
}

inline uint64_t NameSeed(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// ---- Reference quantizers (ggml's reference implementations) ----------------

inline std::string QuantizeQ8_0(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    Put<uint16_t>(&out, Fp32ToFp16(d));
    for (int j = 0; j < 32; ++j) {
      Put<int8_t>(&out, static_cast<int8_t>(std::lround(x[b * 32 + j] * id)));
    }
  }
  return out;
}

inline std::string QuantizeQ4_0(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = &x[b * 32];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(v[j]) > amax) {
        amax = std::fabs(v[j]);
        max = v[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    Put<uint16_t>(&out, Fp32ToFp16(d));
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(v[j] * id + 8.5f));
      const int q1 = std::min(15, static_cast<int>(v[j + 16] * id + 8.5f));
      Put<uint8_t>(&out, static_cast<uint8_t>(q0 | (q1 << 4)));
    }
  }
  return out;
}

inline std::string QuantizeQ4_1(const std::vector<float>& x) {
  std::string out;
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = &x[b * 32];
    float min = v[0], max = v[0];
    for (int j = 1; j < 32; ++j) {
      min = std::min(min, v[j]);
      max = std::max(max, v[j]);
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    Put<uint16_t>(&out, Fp32ToFp16(d));
    Put<uint16_t>(&out, Fp32ToFp16(min));
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>((v[j] - min) * id + 0.5f));
      const int q1 =
          std::min(15, static_cast<int>((v[j + 16] - min) * id + 0.5f));
      Put<uint8_t>(&out, static_cast<uint8_t>(q0 | (q1 << 4)));
    }
  }
  return out;
}

// Encodes `x` as `type` (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
inline std::string Encode(GgmlType type, const std::vector<float>& x) {
  switch (type) {
    case GgmlType::kF16:
      return HalfBytes(x, false);
    case GgmlType::kBF16:
      return HalfBytes(x, true);
    case GgmlType::kQ8_0:
      return QuantizeQ8_0(x);
    case GgmlType::kQ4_0:
      return QuantizeQ4_0(x);
    case GgmlType::kQ4_1:
      return QuantizeQ4_1(x);
    default:
      return FloatBytes(x);
  }
}

// ---- GGUF builder
// -------------------------------------------------------------

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    uint32_t type_id = 0;
    std::vector<uint64_t> shape;
    std::string data;
    std::optional<uint64_t> offset;  // override of the computed offset
  };

  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  // Any value: `type` is the GGUF value type id, `payload` its encoding.
  GgufBuilder& Raw(const std::string& key, uint32_t type,
                   const std::string& payload) {
    kvs_.push_back({key, type, payload});
    return *this;
  }
  template <typename T>
  GgufBuilder& Scalar(const std::string& key, uint32_t type, T v) {
    std::string p;
    Put<T>(&p, v);
    return Raw(key, type, p);
  }
  GgufBuilder& U32(const std::string& k, uint32_t v) { return Scalar(k, 4, v); }
  GgufBuilder& I32(const std::string& k, int32_t v) { return Scalar(k, 5, v); }
  GgufBuilder& F32(const std::string& k, float v) { return Scalar(k, 6, v); }
  GgufBuilder& Bool(const std::string& k, bool v) {
    return Scalar<uint8_t>(k, 7, v ? 1 : 0);
  }
  GgufBuilder& Str(const std::string& k, const std::string& v) {
    std::string p;
    PutStr(&p, v);
    return Raw(k, 8, p);
  }
  GgufBuilder& StrArray(const std::string& k,
                        const std::vector<std::string>& v) {
    std::string p;
    Put<uint32_t>(&p, 8);
    Put<uint64_t>(&p, v.size());
    for (const auto& s : v) PutStr(&p, s);
    return Raw(k, 9, p);
  }
  template <typename T>
  GgufBuilder& Array(const std::string& k, uint32_t elem_type,
                     const std::vector<T>& v) {
    std::string p;
    Put<uint32_t>(&p, elem_type);
    Put<uint64_t>(&p, v.size());
    for (const T& x : v) Put<T>(&p, x);
    return Raw(k, 9, p);
  }

  GgufBuilder& AddTensor(const std::string& name, uint32_t type_id,
                         std::vector<uint64_t> shape, std::string data) {
    tensors_.push_back(
        {name, type_id, std::move(shape), std::move(data), std::nullopt});
    return *this;
  }
  // Encodes `values` as `type`; shape in ggml order.
  GgufBuilder& AddTensor(const std::string& name, GgmlType type,
                         const std::vector<int64_t>& shape,
                         const std::vector<float>& values) {
    std::vector<uint64_t> s(shape.begin(), shape.end());
    return AddTensor(name, static_cast<uint32_t>(type), std::move(s),
                     Encode(type, values));
  }

  Tensor* FindTensor(const std::string& name) {
    for (Tensor& t : tensors_) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
  void RemoveTensor(const std::string& name) {
    std::erase_if(tensors_, [&](const Tensor& t) { return t.name == name; });
  }
  void set_alignment(uint64_t a) { alignment_ = a; }

  std::string Build() const {
    std::string out;
    Put<uint32_t>(&out, 0x46554747);
    Put<uint32_t>(&out, version_);
    Put<uint64_t>(&out, tensors_.size());
    Put<uint64_t>(&out, kvs_.size());
    for (const Kv& kv : kvs_) {
      PutStr(&out, kv.key);
      Put<uint32_t>(&out, kv.type);
      out += kv.payload;
    }
    std::vector<uint64_t> offsets;
    uint64_t off = 0;
    for (const Tensor& t : tensors_) {
      offsets.push_back(off);
      off = Align(off + t.data.size());
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      PutStr(&out, t.name);
      Put<uint32_t>(&out, t.shape.size());
      for (uint64_t d : t.shape) Put<uint64_t>(&out, d);
      Put<uint32_t>(&out, t.type_id);
      Put<uint64_t>(&out, t.offset.value_or(offsets[i]));
    }
    out.resize(Align(out.size()), '\0');
    const size_t base = out.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      out.resize(base + offsets[i], '\0');
      out += tensors_[i].data;
    }
    return out;
  }

 private:
  struct Kv {
    std::string key;
    uint32_t type;
    std::string payload;
  };
  uint64_t Align(uint64_t x) const {
    return (x + alignment_ - 1) / alignment_ * alignment_;
  }

  uint32_t version_;
  uint64_t alignment_ = 32;
  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

// ---- safetensors builder
// --------------------------------------------------------

class SafetensorsBuilder {
 public:
  // `shape` row-major as safetensors stores it.
  SafetensorsBuilder& Add(const std::string& name, const std::string& dtype,
                          const std::vector<int64_t>& shape,
                          const std::string& data) {
    entries_.push_back({name, dtype, shape, data});
    return *this;
  }
  SafetensorsBuilder& AddFloats(const std::string& name, GgmlType type,
                                const std::vector<int64_t>& shape,
                                const std::vector<float>& values) {
    const char* dtype = type == GgmlType::kF32   ? "F32"
                        : type == GgmlType::kF16 ? "F16"
                                                 : "BF16";
    return Add(name, dtype, shape, Encode(type, values));
  }
  SafetensorsBuilder& Metadata(const std::string& k, const std::string& v) {
    metadata_[k] = v;
    return *this;
  }

  std::string HeaderJson() const {
    nlohmann::json h = nlohmann::json::object();
    uint64_t off = 0;
    for (const Entry& e : entries_) {
      h[e.name] = {{"dtype", e.dtype},
                   {"shape", e.shape},
                   {"data_offsets", {off, off + e.data.size()}}};
      off += e.data.size();
    }
    if (!metadata_.empty()) h["__metadata__"] = metadata_;
    std::string s = h.dump();
    s.resize((s.size() + 7) / 8 * 8, ' ');
    return s;
  }
  // `header` replaces the generated JSON when given.
  std::string Build(std::optional<std::string> header = std::nullopt) const {
    const std::string h = header.value_or(HeaderJson());
    std::string out;
    Put<uint64_t>(&out, h.size());
    out += h;
    for (const Entry& e : entries_) out += e.data;
    return out;
  }

 private:
  struct Entry {
    std::string name;
    std::string dtype;
    std::vector<int64_t> shape;
    std::string data;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// ---- Files ------------------------------------------------------------------

class ScopedTempDir {
 public:
  ScopedTempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "kvserve_loader_XXXXXX")
            .string();
    path_ = mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
  }
  ~ScopedTempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(),
                                      ec);
  // NOTE: unlink rather than truncate: ext4 flushes a file truncated to zero
  // on close, which makes rewriting one file thousands of times slow.
  std::filesystem::remove(path, ec);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// ---- A tiny Llama-shaped model ----------------------------------------------

struct TinySpec {
  std::string arch = "llama";
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int kv_heads = 2;
  int inter = 96;
  int vocab = 40;
  bool tied = false;
  bool qkv_bias = false;
  GgmlType matrix_type = GgmlType::kF32;  // 2-D weights; norms stay F32
};

struct TinyTensor {
  std::string name;            // canonical GGUF name
  std::vector<int64_t> shape;  // ggml order
};

inline std::vector<TinyTensor> TinyTensors(const TinySpec& s) {
  const int64_t h = s.hidden, d = s.hidden / s.heads;
  const int64_t q = s.heads * d, kv = s.kv_heads * d;
  std::vector<TinyTensor> out = {{"token_embd.weight", {h, s.vocab}}};
  for (int i = 0; i < s.layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    out.push_back({p + "attn_norm.weight", {h}});
    out.push_back({p + "attn_q.weight", {h, q}});
    out.push_back({p + "attn_k.weight", {h, kv}});
    out.push_back({p + "attn_v.weight", {h, kv}});
    if (s.qkv_bias) {
      out.push_back({p + "attn_q.bias", {q}});
      out.push_back({p + "attn_k.bias", {kv}});
      out.push_back({p + "attn_v.bias", {kv}});
    }
    out.push_back({p + "attn_output.weight", {q, h}});
    out.push_back({p + "ffn_norm.weight", {h}});
    out.push_back({p + "ffn_gate.weight", {h, s.inter}});
    out.push_back({p + "ffn_up.weight", {h, s.inter}});
    out.push_back({p + "ffn_down.weight", {s.inter, h}});
  }
  out.push_back({"output_norm.weight", {h}});
  if (!s.tied) out.push_back({"output.weight", {h, s.vocab}});
  return out;
}

inline int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The float values of tiny tensor `t` (before any quantization).
inline std::vector<float> TinyValues(const TinyTensor& t) {
  return TestValues(NumElements(t.shape), NameSeed(t.name), 0.5f);
}

inline std::vector<std::string> TinyVocab(int n) {
  std::vector<std::string> v = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (int i = 0; static_cast<int>(v.size()) < n; ++i) {
    v.push_back(std::string(1, static_cast<char>('a' + i % 26)) +
                (i >= 26 ? std::to_string(i) : ""));
  }
  return v;
}

inline GgufBuilder TinyGguf(const TinySpec& s) {
  GgufBuilder b;
  const std::string a = s.arch + ".";
  b.Str("general.architecture", s.arch).Str("general.name", "tiny");
  b.U32(a + "block_count", s.layers)
      .U32(a + "context_length", 256)
      .U32(a + "embedding_length", s.hidden)
      .U32(a + "feed_forward_length", s.inter)
      .U32(a + "attention.head_count", s.heads)
      .U32(a + "attention.head_count_kv", s.kv_heads)
      .F32(a + "rope.freq_base", 10000.0f)
      .F32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  std::vector<int32_t> types(s.vocab, 1);
  types[0] = types[1] = types[2] = 3;
  b.Str("tokenizer.ggml.model", "gpt2")
      .Str("tokenizer.ggml.pre", "default")
      .StrArray("tokenizer.ggml.tokens", TinyVocab(s.vocab))
      .Array<int32_t>("tokenizer.ggml.token_type", 5, types)
      .StrArray("tokenizer.ggml.merges", {"a b", "c d"})
      .U32("tokenizer.ggml.bos_token_id", 1)
      .U32("tokenizer.ggml.eos_token_id", 2);
  for (const TinyTensor& t : TinyTensors(s)) {
    const GgmlType type = t.shape.size() == 2 ? s.matrix_type : GgmlType::kF32;
    b.AddTensor(t.name, type, t.shape, TinyValues(t));
  }
  return b;
}

// HF name of a canonical tiny tensor name.
inline std::string TinyHfName(const std::string& canonical) {
  static const std::map<std::string, std::string> kGlobal = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  if (auto it = kGlobal.find(canonical); it != kGlobal.end()) return it->second;
  const size_t dot1 = canonical.find('.');
  const size_t dot2 = canonical.find('.', dot1 + 1);
  const std::string layer = canonical.substr(dot1 + 1, dot2 - dot1 - 1);
  return "model.layers." + layer + "." + kLayer.at(canonical.substr(dot2 + 1));
}

inline std::string TinyHfConfig(const TinySpec& s) {
  nlohmann::json c = {{"model_type", s.arch},
                      {"num_hidden_layers", s.layers},
                      {"hidden_size", s.hidden},
                      {"num_attention_heads", s.heads},
                      {"num_key_value_heads", s.kv_heads},
                      {"intermediate_size", s.inter},
                      {"vocab_size", s.vocab},
                      {"max_position_embeddings", 256},
                      {"rope_theta", 10000.0},
                      {"rms_norm_eps", 1e-6},
                      {"rope_scaling", nullptr},
                      {"tie_word_embeddings", s.tied},
                      {"torch_dtype", "bfloat16"}};
  return c.dump(2);
}

// Writes config.json, tokenizer.json and the weights (BF16 matrices, F32
// norms) into `dir`: model.safetensors when `shards` is 1, else
// model-0000i-of-0000n.safetensors plus model.safetensors.index.json.
inline void WriteTinyHfDir(const std::string& dir, const TinySpec& s,
                           int shards) {
  WriteFile(dir + "/config.json", TinyHfConfig(s));
  WriteFile(dir + "/tokenizer.json", "{}");
  const std::vector<TinyTensor> tensors = TinyTensors(s);
  std::vector<SafetensorsBuilder> builders(shards);
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TinyTensor& t = tensors[i];
    const std::vector<int64_t> rm(t.shape.rbegin(), t.shape.rend());
    const GgmlType type =
        t.shape.size() == 2 ? GgmlType::kBF16 : GgmlType::kF32;
    const int shard = static_cast<int>(i * shards / tensors.size());
    builders[shard].AddFloats(TinyHfName(t.name), type, rm, TinyValues(t));
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors",
                  shard + 1, shards);
    weight_map[TinyHfName(t.name)] = file;
  }
  if (shards == 1) {
    WriteFile(dir + "/model.safetensors", builders[0].Build());
    return;
  }
  for (int i = 0; i < shards; ++i) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05d-of-%05d.safetensors", i + 1,
                  shards);
    WriteFile(dir + "/" + file, builders[i].Build());
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", weight_map}};
  WriteFile(dir + "/model.safetensors.index.json", index.dump(2));
}

}  // namespace kvserve::models::testing
