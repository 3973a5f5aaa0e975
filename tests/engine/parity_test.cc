// Parity with llama.cpp and with an exact float64 forward on the embedded
// default model (SmolLM2-135M-Instruct Q4_1). Golden data: tests/data/parity/,
// produced by tools/gen_parity_golden.py (llama-cpp-python on the same GGUF
// file, and numpy over its dequantized weights). Checked: last-position
// logits within kLogitsTolerance of both (relative L2), the same argmax as
// both, and per-step greedy agreement with llama.cpp under teacher forcing.
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

// NOTE: measured, not wished for. llama.cpp quantizes activations to int8
// per 32-block before every matmul (Q8_0/Q8_1), and so do our int8 kernels;
// on this model that alone moves the last-position logits 4-7% (relative
// L2) away from exact math: llama.cpp differs from an fp64 numpy forward of
// the same dequantized weights by 0.9-5.8% (tools/gen_parity_golden.py
// prints it; the fp64 logits are golden data too), while our fp32 path
// matches that forward to 3e-6. Two independent ~5% perturbations cannot
// agree to 1e-2; they agree to ~5%. Per-step greedy agreement under teacher
// forcing is 96% (247 of 256), 60 of 64 in the first 8 steps: the misses
// are near-ties between the top two logits. The int8 activations also make
// the last-position logits of these short prompts sensitive to float
// rounding upstream: moving every attention output by one ULP (random sign,
// five seeds) moved the 5-token case between 3.8% and 8.3% from llama.cpp,
// and the flash-style attention kernel (same math, another summation order,
// outputs within 1 ULP of the two-pass kernel's) puts it at 9.6%, the
// 8-token case at 10.4% from the fp64 forward. Hence 12%, not 8%.
constexpr double kLogitsTolerance = 0.12;
constexpr double kTokenAgreement = 0.95;
constexpr double kFirst8Agreement = 0.90;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
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
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(cases[c]["prompt"].get<std::string>());
    const auto prompt = cases[c]["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = cases[c]["greedy_ids"].get<std::vector<int32_t>>();
    engine::SequenceRunner runner(model->get(), kv->get());
    auto logits = runner.Append(prompt);
    ASSERT_TRUE(logits.ok()) << logits.status();
    double num = 0, den = 0;
    for (int v = 0; v < n_vocab; ++v) {
      const double r = ref_logits[c * n_vocab + v];
      num += ((*logits)[v] - r) * ((*logits)[v] - r);
      den += r * r;
    }
    const double rel = std::sqrt(num / den);
    EXPECT_LE(rel, kLogitsTolerance) << "last-position logits";
    std::printf("case %zu: %zu prompt tokens, logits rel. error %.4f\n", c,
                prompt.size(), rel);
    EXPECT_EQ(Argmax(*logits), want[0]) << "first greedy token";
    double enum_ = 0, eden = 0;
    for (int v = 0; v < n_vocab; ++v) {
      const double e = exact[c * n_vocab + v];
      enum_ += ((*logits)[v] - e) * ((*logits)[v] - e);
      eden += e * e;
    }
    EXPECT_LE(std::sqrt(enum_ / eden), kLogitsTolerance) << "vs fp64 forward";
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
  EXPECT_GE(agree, kTokenAgreement * total);
  EXPECT_GE(first8, kFirst8Agreement * 8 * cases.size());
}

}  // namespace
}  // namespace kvserve::models
