#include "cli/cli_generate.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/kv_dtype_flag.h"
#include "common/cli_args.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "engine/cpu_backend.h"
#include "engine/kv_cache_storage.h"
#include "engine/loaded_model.h"
#include "engine/sampler.h"
#include "engine/sequence_runner.h"
#include "kvcache/kv_sizing.h"
#include "models/tokenizer/chat_template.h"
#include "models/tokenizer/detokenizer.h"

namespace kvserve::cli {
namespace {

struct GenerateFlags {
  std::string model = "smollm2-135m";
  std::string prompt;
  std::string system;
  bool chat = true;
  bool ignore_eos = false;
  int64_t max_tokens = 128;
  double temperature = 0.8, top_p = 0.95, min_p = 0.05;
  double repetition_penalty = 1.0;
  int64_t top_k = 40;
  int64_t seed = -1;
  int64_t threads = 0;
  int64_t block_size = 16;
  std::string kv_cache_dtype = "auto";
};

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const engine::LoadedModel& m,
                                                  const GenerateFlags& f) {
  std::string text = f.prompt;
  const bool chat = f.chat && m.chat_format != models::ChatFormat::kNone;
  if (chat) {
    std::vector<models::ChatMessage> msgs;
    if (!f.system.empty()) msgs.push_back({"system", f.system});
    msgs.push_back({"user", f.prompt});
    KV_ASSIGN_OR_RETURN(text, models::RenderChat(m.chat_format, msgs,
                                                 /*add_generation_prompt=*/true,
                                                 m.chat_template));
  }
  return m.tokenizer->Encode(text, /*add_special=*/true,
                             /*parse_special=*/chat);
}

absl::Status Generate(const GenerateFlags& f) {
  if (f.threads > 0) SetNumThreads(static_cast<int>(f.threads));
  const auto t_load = Clock::now();
  // The single-sequence runner below runs the packed CPU model.
  KV_ASSIGN_OR_RETURN(engine::LoadedModel m,
                      engine::LoadModel(f.model, engine::Device::kCpu));
  KV_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptTokens(m, f));
  if (prompt.empty()) {
    return absl::InvalidArgumentError("--prompt: produced no tokens");
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + f.max_tokens;
  if (total > m.config.max_position) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max-tokens: prompt (%d tokens) + max_tokens (%d) exceeds the "
        "model's context of %d",
        prompt.size(), f.max_tokens, m.config.max_position));
  }
  KV_ASSIGN_OR_RETURN(const std::optional<kvcache::KvDtype> requested,
                      ParseKvCacheDtypeFlag(f.kv_cache_dtype));
  KV_ASSIGN_OR_RETURN(const kvcache::KvDtype dtype,
                      engine::CpuKvDtype(requested, m.config.head_dim));
  KV_ASSIGN_OR_RETURN(
      auto kv,
      engine::KvCacheStorage::Create(
          {m.config.num_layers, m.config.num_kv_heads, m.config.head_dim,
           static_cast<int32_t>(f.block_size),
           static_cast<int32_t>((total + f.block_size - 1) / f.block_size), 0,
           dtype}));
  std::fprintf(stderr, "model: %s (%s) loaded in %.2f s, %d threads\n",
               m.path.c_str(), m.format.c_str(), Seconds(t_load, Clock::now()),
               NumThreads());

  engine::SamplingParams sp;
  sp.temperature = static_cast<float>(f.temperature);
  sp.top_k = static_cast<int32_t>(f.top_k);
  sp.top_p = static_cast<float>(f.top_p);
  sp.min_p = static_cast<float>(f.min_p);
  sp.repetition_penalty = static_cast<float>(f.repetition_penalty);
  sp.seed =
      f.seed >= 0 ? static_cast<uint64_t>(f.seed) : std::random_device{}();
  engine::SamplerState state(sp.seed);
  engine::SequenceRunner runner(m.model.get(), kv.get());
  models::Detokenizer detok(m.tokenizer.get());

  const auto t0 = Clock::now();
  KV_ASSIGN_OR_RETURN(absl::Span<const float> logits, runner.Append(prompt));
  const auto t1 = Clock::now();
  std::vector<int32_t> context = prompt;
  std::vector<float> work;
  int64_t generated = 0;
  for (; generated < f.max_tokens; ++generated) {
    work.assign(logits.begin(), logits.end());
    const int32_t tok =
        engine::Sample(absl::MakeSpan(work), sp, context, state).token;
    if (!f.ignore_eos && m.tokenizer->IsEog(tok)) break;
    context.push_back(tok);
    std::fputs(detok.Add(tok).c_str(), stdout);
    std::fflush(stdout);
    if (generated + 1 == f.max_tokens) {
      ++generated;
      break;
    }
    KV_ASSIGN_OR_RETURN(logits, runner.Append({&tok, 1}));
  }
  std::fputs(detok.Flush().c_str(), stdout);
  std::fputs("\n", stdout);
  const auto t2 = Clock::now();
  std::fprintf(stderr,
               "prefill: %zu tokens in %.3f s (%.1f tokens/s)\n"
               "decode: %lld tokens in %.3f s (%.1f tokens/s), seed %llu\n",
               prompt.size(), Seconds(t0, t1), prompt.size() / Seconds(t0, t1),
               (long long)generated, Seconds(t1, t2),
               generated / std::max(Seconds(t1, t2), 1e-9),
               (unsigned long long)sp.seed);
  return absl::OkStatus();
}

}  // namespace

int RunGenerateCommand(int argc, const char* const* argv) {
  GenerateFlags f;
  bool help = false;
  CliArgs args("generate");
  args.String("model", &f.model, "preset name, .gguf file, or HF directory");
  args.String("prompt", &f.prompt, "the prompt text");
  args.String("system", &f.system, "system message (chat models)");
  args.Bool("chat", &f.chat,
            "wrap the prompt in the model's chat format (--no-chat: raw)");
  args.Int("max-tokens", &f.max_tokens, "tokens to generate", 1, 1 << 20);
  args.Float("temperature", &f.temperature, "0 = greedy", 0.0, 100.0);
  args.Int("top-k", &f.top_k, "0 = off", 0, 1 << 30);
  args.Float("top-p", &f.top_p, "nucleus sampling", 0.0, 1.0);
  args.Float("min-p", &f.min_p, "min-p sampling", 0.0, 1.0);
  args.Float("repetition-penalty", &f.repetition_penalty, "1 = off", 0.01,
             100.0);
  args.Int("seed", &f.seed, "random seed (default: random)", -1, INT64_MAX);
  args.Bool("ignore-eos", &f.ignore_eos, "keep going past end of sequence");
  args.Int("threads", &f.threads, "CPU threads (default: all)", 0, 1024);
  args.Int("block-size", &f.block_size, "KV block size in tokens", 1, 1024);
  args.String("kv-cache-dtype", &f.kv_cache_dtype,
              "KV element type: auto (fp16), f32, fp16, bf16, int8, int4");
  args.Bool("help", &help, "show this help");
  absl::Status s = args.Parse(argc, argv, 2);
  if (help) {
    std::fputs(args.Usage().c_str(), stdout);
    return 0;
  }
  if (s.ok() && f.prompt.empty()) {
    s = absl::InvalidArgumentError("generate: --prompt is required");
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kvserve: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  s = Generate(f);
  if (!s.ok()) {
    std::fprintf(stderr, "kvserve generate: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace kvserve::cli
