// Parity with llama.cpp and with an exact float64 forward on the embedded
// default model (SmolLM2-135M-Instruct Q4_1). Golden data: tests/data/parity/,
// produced by tools/gen_parity_golden.py (llama-cpp-python on the same GGUF
// file, and numpy over its dequantized weights). Checked: the last-position
// logits' mean distance (relative L2, over the golden prompts) from exact
// math and from llama.cpp, each within a small factor of llama.cpp's own
// mean distance from exact math; the same argmax as both; and per-step
// greedy agreement with llama.cpp under teacher forcing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/runner/kv_cache_storage.h"
#include "gtest/gtest.h"
#include "models/cpu/cpu_llama_model.h"
#include "models/loader/model_files.h"
#include "nlohmann/json.hpp"
#include "tests/engine/sequence_runner.h"

namespace kvserve::models {
namespace {

constexpr char kModel[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kGolden[] = KVSERVE_SOURCE_DIR "/tests/data/parity/";

// NOTE: the bound is tied to the reference. llama.cpp quantizes activations
// to int8 per 32-block before every matmul (Q8_0/Q8_1), and so do our int8
// kernels; our fp32 path matches the fp64 forward to 3e-6, so llama.cpp's
// own distance from the fp64 forward (golden data, per prompt) is what int8
// activations alone cost: the floor of any int8 engine. Our int8 path takes
// an independent perturbation of that size (another blocking, summation
// order and rounding), so its distance from exact math is bounded by a small
// factor of llama.cpp's, and its distance from llama.cpp (two independent
// perturbations: about sqrt(2) of one) by a factor a little larger. Means
// over the prompts, because single short prompts swing: one ULP of random
// sign on every attention output moved the 5-token case between 3.8% and
// 8.3% from llama.cpp. Measured (2026-12-05, f32 KV): llama.cpp's mean
// distance from fp64 0.032 (0.9-5.8% per prompt); ours 1.14x it from fp64
// and 1.20x it from llama.cpp (sqrt(2) = 1.41x would be two independent
// perturbations of llama.cpp's size).
constexpr double kExactFactor = 1.5;
constexpr double kPeerFactor = 1.6;
constexpr double kTokenAgreement = 0.95;
constexpr double kFirst8Agreement = 0.90;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Relative L2 distance of a from b over n values.
double RelL2(const float* a, const float* b, int n) {
  double num = 0, den = 0;
  for (int v = 0; v < n; ++v) {
    num += (double{a[v]} - b[v]) * (double{a[v]} - b[v]);
    den += double{b[v]} * b[v];
  }
  return std::sqrt(num / den);
}

int32_t Argmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST(LlamaCppParity, DefaultModelMatchesGolden) {
  auto golden = nlohmann::json::parse(
      ReadFile(std::string(kGolden) + "parity.json"), nullptr, false);
  ASSERT_FALSE(golden.is_discarded()) << "missing or bad parity.json";
  const std::string logits_blob =
      ReadFile(std::string(kGolden) + "parity_logits.f32");
  const int n_vocab = golden["n_vocab"].get<int>();
  const auto& cases = golden["cases"];
  ASSERT_EQ(logits_blob.size(), cases.size() * n_vocab * sizeof(float));
  const float* ref_logits = reinterpret_cast<const float*>(logits_blob.data());
  const std::string exact_blob =
      ReadFile(std::string(kGolden) + "parity_fp64_logits.f32");
  ASSERT_EQ(exact_blob.size(), logits_blob.size());
  const float* exact = reinterpret_cast<const float*>(exact_blob.data());

  auto files = OpenModelFiles(kModel);
  ASSERT_TRUE(files.ok()) << files.status()
                          << " (run deploy/setup.sh to fetch the model)";
  const ModelConfig config = files->config;
  ASSERT_EQ(config.vocab_size, n_vocab);
  auto model = CpuLlamaModel::Create(config, std::move(files->weights));
  ASSERT_TRUE(model.ok()) << model.status();
  auto kv = engine::KvCacheStorage::Create(
      {config.num_layers, config.num_kv_heads, config.head_dim, 16, 64, 0});
  ASSERT_TRUE(kv.ok()) << kv.status();

  // Teacher forcing: feed llama.cpp's greedy continuation and check, at
  // every position, that our argmax is llama.cpp's next token. (Free-running
  // greedy decoding would compare nothing after the first near-tie.)
  int agree = 0, total = 0, first8 = 0;
  double ours_exact = 0, ours_peer = 0, peer_exact = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(cases[c]["prompt"].get<std::string>());
    const auto prompt = cases[c]["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = cases[c]["greedy_ids"].get<std::vector<int32_t>>();
    engine::SequenceRunner runner(model->get(), kv->get());
    auto logits = runner.Append(prompt);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const float* peer = ref_logits + c * n_vocab;
    const float* fp64 = exact + c * n_vocab;
    const double to_peer = RelL2(logits->data(), peer, n_vocab);
    const double to_exact = RelL2(logits->data(), fp64, n_vocab);
    const double peer_to_exact = RelL2(peer, fp64, n_vocab);
    ours_peer += to_peer / static_cast<double>(cases.size());
    ours_exact += to_exact / static_cast<double>(cases.size());
    peer_exact += peer_to_exact / static_cast<double>(cases.size());
    std::printf(
        "case %zu: %zu prompt tokens, logits rel. L2: to llama.cpp %.4f, to "
        "fp64 %.4f (llama.cpp to fp64 %.4f)\n",
        c, prompt.size(), to_peer, to_exact, peer_to_exact);
    EXPECT_EQ(Argmax(*logits), want[0]) << "first greedy token";
    EXPECT_EQ(Argmax(*logits),
              Argmax({exact + c * n_vocab, static_cast<size_t>(n_vocab)}))
        << "argmax vs fp64 forward";
    for (size_t i = 0; i < want.size(); ++i) {
      const bool ok = Argmax(*logits) == want[i];
      agree += ok;
      first8 += ok && i < 8;
      ++total;
      logits = runner.Append({&want[i], 1});
      ASSERT_TRUE(logits.ok()) << logits.status();
    }
  }
  std::printf("greedy agreement: %d of %d tokens, %d of %zu in the first 8\n",
              agree, total, first8, 8 * cases.size());
  std::printf(
      "mean logits rel. L2: to fp64 %.4f (%.2f x llama.cpp's %.4f), to "
      "llama.cpp %.4f (%.2f x)\n",
      ours_exact, ours_exact / peer_exact, peer_exact, ours_peer,
      ours_peer / peer_exact);
  EXPECT_LE(ours_exact, kExactFactor * peer_exact) << "mean, vs fp64";
  EXPECT_LE(ours_peer, kPeerFactor * peer_exact) << "mean, vs llama.cpp";
  EXPECT_GE(agree, kTokenAgreement * total);
  EXPECT_GE(first8, kFirst8Agreement * 8 * cases.size());
}

}  // namespace
}  // namespace kvserve::models
