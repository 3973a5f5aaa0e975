// Test support: a random-weight Llama-family model held in memory (F32
// tensors under GGUF names) and a naive dense reference forward computed in
// double precision, one sequence at a time, without any cache.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "models/model_config.h"
#include "models/rope.h"
#include "models/weights.h"

namespace kvserve::models::testing {

class MemoryWeights : public WeightSource {
 public:
  const std::string& origin() const override { return origin_; }
  bool Has(const std::string& name) const override {
    return tensors_.count(name) > 0;
  }
  absl::StatusOr<RawTensor> Get(const std::string& name) const override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return absl::NotFoundError(absl::StrCat("missing tensor ", name));
    }
    const Entry& e = it->second;
    return RawTensor{name, GgmlType::kF32, e.shape, e.data.data(),
                     e.data.size() * sizeof(float)};
  }
  std::map<std::string, int64_t> TensorBytesByType() const override {
    int64_t bytes = 0;
    for (const auto& [name, e] : tensors_) {
      bytes += static_cast<int64_t>(e.data.size() * sizeof(float));
    }
    return {{"F32", bytes}};
  }
  // shape in ggml order ({cols, rows} for matrices).
  void Add(const std::string& name, std::vector<int64_t> shape,
           std::vector<float> data) {
    tensors_[name] = Entry{std::move(shape), std::move(data)};
  }
  const std::vector<float>& Data(const std::string& name) const {
    return tensors_.at(name).data;
  }

 private:
  struct Entry {
    std::vector<int64_t> shape;
    std::vector<float> data;
  };
  std::string origin_ = "<memory>";
  std::map<std::string, Entry> tensors_;
};

inline ModelConfig SmallConfig(int heads, int kv_heads, bool qkv_bias = false,
                               RopeStyle style = RopeStyle::kInterleaved) {
  ModelConfig c;
  c.name = absl::StrCat("random-", heads, "x", kv_heads);
  c.architecture = "llama";
  c.num_layers = 2;
  c.head_dim = 16;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.vocab_size = 101;
  c.max_position = 4096;
  c.rope_theta = 10000.0f;
  c.rms_norm_eps = 1e-5f;
  c.rope_style = style;
  c.qkv_bias = qkv_bias;
  c.tied_embeddings = false;
  return c;
}

inline std::unique_ptr<MemoryWeights> RandomWeights(const ModelConfig& c,
                                                    uint32_t seed) {
  std::mt19937 rng(seed);
  auto make = [&](int64_t n, float scale, float mean = 0.0f) {
    std::normal_distribution<float> dist(mean, scale);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  auto w = std::make_unique<MemoryWeights>();
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q = c.num_heads * d, kv = c.num_kv_heads * d;
  w->Add("token_embd.weight", {h, c.vocab_size}, make(h * c.vocab_size, 1.0f));
  w->Add("output_norm.weight", {h}, make(h, 0.1f, 1.0f));
  w->Add("output.weight", {h, c.vocab_size}, make(h * c.vocab_size, 0.2f));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    w->Add(p + "attn_norm.weight", {h}, make(h, 0.1f, 1.0f));
    w->Add(p + "ffn_norm.weight", {h}, make(h, 0.1f, 1.0f));
    w->Add(p + "attn_q.weight", {h, q}, make(h * q, 0.3f));
    w->Add(p + "attn_k.weight", {h, kv}, make(h * kv, 0.3f));
    w->Add(p + "attn_v.weight", {h, kv}, make(h * kv, 0.3f));
    w->Add(p + "attn_output.weight", {q, h}, make(q * h, 0.2f));
    w->Add(p + "ffn_gate.weight", {h, inter}, make(h * inter, 0.2f));
    w->Add(p + "ffn_up.weight", {h, inter}, make(h * inter, 0.2f));
    w->Add(p + "ffn_down.weight", {inter, h}, make(inter * h, 0.2f));
    if (c.qkv_bias) {
      w->Add(p + "attn_q.bias", {q}, make(q, 0.5f));
      w->Add(p + "attn_k.bias", {kv}, make(kv, 0.5f));
      w->Add(p + "attn_v.bias", {kv}, make(kv, 0.5f));
    }
  }
  return w;
}

// Dense reference: logits [tokens.size()][vocab] for one sequence.
class DenseReference {
 public:
  DenseReference(const ModelConfig& c, const MemoryWeights& w)
      : c_(c), w_(w), rope_(c) {}

  // Query i attends key t <= i only where mask(i, t) (and within the
  // model's sliding window): a bounded KV policy's drops, as the keys each
  // token saw when it was computed.
  void set_mask(std::function<bool(int64_t, int64_t)> mask) {
    mask_ = std::move(mask);
  }
  // Query i scores key t with its query rotated at position i - shift(i, t)
  // (0 by default): a bounded KV policy's sinks seen at their in-cache
  // distance.
  void set_query_shift(std::function<int64_t(int64_t, int64_t)> shift) {
    shift_ = std::move(shift);
  }

  std::vector<std::vector<double>> Logits(const std::vector<int32_t>& tokens) {
    const int64_t n = tokens.size(), h = c_.hidden_size;
    std::vector<std::vector<double>> x(n, std::vector<double>(h));
    const auto& emb = w_.Data("token_embd.weight");
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < h; ++j) x[i][j] = emb[tokens[i] * h + j];
    }
    for (int l = 0; l < c_.num_layers; ++l) Layer(l, x);
    std::vector<std::vector<double>> logits(n);
    for (int64_t i = 0; i < n; ++i) {
      logits[i] = Linear("output.weight", Norm(x[i], "output_norm.weight"),
                         c_.vocab_size);
    }
    return logits;
  }

 private:
  std::vector<double> Norm(const std::vector<double>& x,
                           const std::string& name) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double r = 1.0 / std::sqrt(ss / x.size() + c_.rms_norm_eps);
    const auto& g = w_.Data(name);
    std::vector<double> y(x.size());
    for (size_t j = 0; j < x.size(); ++j) y[j] = x[j] * r * g[j];
    return y;
  }
  std::vector<double> Linear(const std::string& name,
                             const std::vector<double>& x, int64_t rows) {
    const auto& wt = w_.Data(name);
    const int64_t cols = x.size();
    std::vector<double> y(rows, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t k = 0; k < cols; ++k) y[r] += wt[r * cols + k] * x[k];
    }
    return y;
  }
  void AddBias(std::vector<double>& y, const std::string& name) {
    if (!w_.Has(name)) return;
    const auto& b = w_.Data(name);
    for (size_t j = 0; j < y.size(); ++j) y[j] += b[j];
  }
  void Rotate(std::vector<double>& v, int heads, int pos) {
    const int d = c_.head_dim, half = d / 2;
    for (int hh = 0; hh < heads; ++hh) {
      double* p = v.data() + hh * d;
      for (int i = 0; i < half; ++i) {
        const double a = static_cast<double>(pos) * rope_.inv_freq()[i];
        const int i0 = c_.rope_style == RopeStyle::kInterleaved ? 2 * i : i;
        const int i1 =
            c_.rope_style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
        const double x0 = p[i0], x1 = p[i1];
        p[i0] = x0 * std::cos(a) - x1 * std::sin(a);
        p[i1] = x0 * std::sin(a) + x1 * std::cos(a);
      }
    }
  }
  void Layer(int l, std::vector<std::vector<double>>& x) {
    const std::string p = absl::StrCat("blk.", l, ".");
    const int64_t n = x.size(), d = c_.head_dim;
    const int64_t qd = c_.num_heads * d, kvd = c_.num_kv_heads * d;
    std::vector<std::vector<double>> q(n), k(n), v(n), q_raw(n);
    for (int64_t i = 0; i < n; ++i) {
      auto hn = Norm(x[i], p + "attn_norm.weight");
      q[i] = Linear(p + "attn_q.weight", hn, qd);
      k[i] = Linear(p + "attn_k.weight", hn, kvd);
      v[i] = Linear(p + "attn_v.weight", hn, kvd);
      AddBias(q[i], p + "attn_q.bias");
      AddBias(k[i], p + "attn_k.bias");
      AddBias(v[i], p + "attn_v.bias");
      q_raw[i] = q[i];
      Rotate(q[i], c_.num_heads, i);
      Rotate(k[i], c_.num_kv_heads, i);
    }
    const int group = c_.num_heads / c_.num_kv_heads;
    for (int64_t i = 0; i < n; ++i) {
      std::vector<double> att(qd, 0.0);
      for (int hh = 0; hh < c_.num_heads; ++hh) {
        const int kvh = hh / group;
        const int64_t lo = c_.sliding_window > 0
                               ? std::max<int64_t>(0, i - c_.sliding_window + 1)
                               : 0;
        std::vector<int64_t> keys;
        for (int64_t t = lo; t <= i; ++t) {
          if (!mask_ || mask_(i, t)) keys.push_back(t);
        }
        std::vector<double> s;
        double mx = -1e300;
        for (int64_t t : keys) {
          const int64_t shift = shift_ ? shift_(i, t) : 0;
          std::vector<double> shifted;
          if (shift != 0) {
            shifted = q_raw[i];
            Rotate(shifted, c_.num_heads, static_cast<int>(i - shift));
          }
          const std::vector<double>& qi = shift != 0 ? shifted : q[i];
          double dot = 0;
          for (int j = 0; j < d; ++j) dot += qi[hh * d + j] * k[t][kvh * d + j];
          s.push_back(dot / std::sqrt(static_cast<double>(d)));
          mx = std::max(mx, s.back());
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t u = 0; u < keys.size(); ++u) {
          for (int j = 0; j < d; ++j) {
            att[hh * d + j] += s[u] / sum * v[keys[u]][kvh * d + j];
          }
        }
      }
      auto o = Linear(p + "attn_output.weight", att, c_.hidden_size);
      for (int64_t j = 0; j < c_.hidden_size; ++j) x[i][j] += o[j];
      auto hn = Norm(x[i], p + "ffn_norm.weight");
      auto g = Linear(p + "ffn_gate.weight", hn, c_.intermediate_size);
      auto u = Linear(p + "ffn_up.weight", hn, c_.intermediate_size);
      for (int64_t j = 0; j < c_.intermediate_size; ++j) {
        g[j] = g[j] / (1.0 + std::exp(-g[j])) * u[j];
      }
      auto dn = Linear(p + "ffn_down.weight", g, c_.hidden_size);
      for (int64_t j = 0; j < c_.hidden_size; ++j) x[i][j] += dn[j];
    }
  }

  const ModelConfig& c_;
  const MemoryWeights& w_;
  Rope rope_;
  std::function<bool(int64_t, int64_t)> mask_;
  std::function<int64_t(int64_t, int64_t)> shift_;
};

}  // namespace kvserve::models::testing
