// Parity with llama.cpp on the embedded default model (SmolLM2-135M-Instruct
// Q4_1). Golden data: tests/data/parity/, produced by
// tools/gen_parity_golden.py with llama-cpp-python on the same GGUF file.
// Tolerances: last-prompt-position logits within 1e-2 relative (L2); greedy
// 32-token continuations agree on the first 8 tokens of every prompt and on
// >= 95% of all tokens.
#include <fstream>
#include <sstream>

#include "engine/kv_cache_storage.h"
#include "engine/sequence_runner.h"
#include "gtest/gtest.h"
#include "models/llama_model.h"
#include "models/model_files.h"
#include "nlohmann/json.hpp"

namespace kvserve::models {
namespace {

constexpr char kModel[] =
    KVSERVE_SOURCE_DIR "/weights/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kGolden[] = KVSERVE_SOURCE_DIR "/tests/data/parity/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int32_t Argmax(absl::Span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) -
                              v.begin());
}

TEST(LlamaCppParity, DefaultModelMatchesGolden) {
  auto golden = nlohmann::json::parse(ReadFile(std::string(kGolden) +
                                               "parity.json"),
                                      nullptr, false);
  ASSERT_FALSE(golden.is_discarded()) << "missing or bad parity.json";
  const std::string logits_blob =
      ReadFile(std::string(kGolden) + "parity_logits.f32");
  const int n_vocab = golden["n_vocab"].get<int>();
  const auto& cases = golden["cases"];
  ASSERT_EQ(logits_blob.size(), cases.size() * n_vocab * sizeof(float));
  const float* ref_logits = reinterpret_cast<const float*>(logits_blob.data());

  auto files = OpenModelFiles(kModel);
  ASSERT_TRUE(files.ok()) << files.status()
                          << " (run deploy/setup.sh to fetch the model)";
  const ModelConfig config = files->config;
  ASSERT_EQ(config.vocab_size, n_vocab);
  auto model = LlamaModel::Create(config, std::move(files->weights));
  ASSERT_TRUE(model.ok()) << model.status();
  auto kv = engine::KvCacheStorage::Create(
      {config.num_layers, config.num_kv_heads, config.head_dim, 16, 64, 0});
  ASSERT_TRUE(kv.ok()) << kv.status();

  int agree = 0, total = 0;
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
    EXPECT_LE(std::sqrt(num / den), 1e-2) << "last-position logits";
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      const int32_t tok = Argmax(*logits);
      got.push_back(tok);
      if (i + 1 < want.size()) {
        logits = runner.Append({&tok, 1});
        ASSERT_TRUE(logits.ok()) << logits.status();
      }
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (i < 8) EXPECT_EQ(got[i], want[i]) << "greedy token " << i;
      agree += got[i] == want[i];
      ++total;
    }
  }
  EXPECT_GE(agree, 0.95 * total) << agree << " of " << total << " agree";
}

}  // namespace
}  // namespace kvserve::models
