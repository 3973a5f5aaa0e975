#include "cli/cli_generate.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cli/engine_flags.h"
#include "cli/logging.h"
#include "common/cli_args.h"
#include "common/clock.h"
#include "common/field_error.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "engine/engine.h"
#include "engine/runner/loaded_model.h"
#include "engine/runner/model_backend.h"
#include "engine/runner/platform.h"
#include "engine/stream_state.h"
#include "kvcache/kv_sizing.h"
#include "kvserve/v1/kvserve.pb.h"
#include "models/loader/presets.h"
#include "server/request_validation.h"
#include "server/status_mapping.h"

namespace kvserve::cli {
namespace {

// The flags. The sampling ones (max-tokens through seed) reach the request
// only when given: ToRequestSpec fills the others with the server's
// defaults, so an unset flag means what an unset request field means.
struct GenerateFlags {
  // --model, --threads, --device, --kv-cache-dtype, --block-size.
  EngineFlags engine =
      EngineFlagsFrom(engine::EngineConfig(), "smollm2-135m", "cpu");
  std::string prompt;
  std::string system;
  bool chat = true;
  int64_t max_tokens = 0;
  double temperature = 0, top_p = 0, min_p = 0, repetition_penalty = 0;
  int64_t top_k = 0;
  int64_t seed = -1;
  bool ignore_eos = false;
};

constexpr uint32_t kGenerateEngineFlags = kModelFlags | kDeviceFlags;

using Clock = std::chrono::steady_clock;

// The request the server would receive for these flags: the prompt as chat
// messages when `chat` (the model has a chat format and --chat is on), else
// as raw text; only the sampling flags that were given.
v1::GenerateRequest BuildRequest(const GenerateFlags& f, const CliArgs& args,
                                 bool chat) {
  v1::GenerateRequest req;
  if (chat) {
    v1::ChatMessages* messages = req.mutable_chat();
    if (!f.system.empty()) {
      v1::ChatMessage* m = messages->add_messages();
      m->set_role("system");
      m->set_content(f.system);
    }
    v1::ChatMessage* m = messages->add_messages();
    m->set_role("user");
    m->set_content(f.prompt);
  } else {
    req.set_prompt(f.prompt);
  }
  v1::SamplingParams* p = req.mutable_sampling();
  if (args.Seen("max-tokens")) {
    p->set_max_tokens(static_cast<int32_t>(f.max_tokens));
  }
  if (args.Seen("temperature")) {
    p->set_temperature(static_cast<float>(f.temperature));
  }
  if (args.Seen("top-k")) p->set_top_k(static_cast<int32_t>(f.top_k));
  if (args.Seen("top-p")) p->set_top_p(static_cast<float>(f.top_p));
  if (args.Seen("min-p")) p->set_min_p(static_cast<float>(f.min_p));
  if (args.Seen("repetition-penalty")) {
    p->set_repetition_penalty(static_cast<float>(f.repetition_penalty));
  }
  if (f.seed >= 0) p->set_seed(static_cast<uint64_t>(f.seed));
  p->set_ignore_eos(f.ignore_eos);
  return req;
}

// KV bytes for one sequence of `tokens` tokens: whole blocks of the dtype
// the platform of `device` stores.
absl::StatusOr<int64_t> SequenceKvBytes(const models::ModelConfig& config,
                                        const engine::EngineConfig& e,
                                        engine::Device device, int64_t tokens) {
  KV_ASSIGN_OR_RETURN(const kvcache::KvDtype dtype,
                      engine::PlatformFor(device).ResolveKvDtype(
                          e.kv_cache_dtype, config.head_dim));
  const int32_t block_size = e.scheduler.block_size;
  const int64_t blocks = (tokens + block_size - 1) / block_size;
  return blocks *
         kvcache::KvBytesPerBlock(models::KvShapeOf(config), dtype, block_size);
}

// The blocking consumer of one StreamState: the sink (engine thread) parks
// the one delta in flight, Next() takes it on the calling thread.
class DeltaReader {
 public:
  explicit DeltaReader(const std::shared_ptr<engine::StreamState>& stream)
      : stream_(stream) {
    stream_->Attach([box = box_](engine::StreamDelta d) {
      absl::MutexLock lock(&box->mu);
      box->delta = std::move(d);
      box->ready = true;
    });
  }

  // The next delta, in order; the last one has `finished` set, and Next()
  // must not be called after it. Acknowledges the previous delta first.
  engine::StreamDelta Next() {
    if (delivered_) stream_->Ack();  // may run the sink on this thread
    delivered_ = true;
    absl::MutexLock lock(&box_->mu);
    box_->mu.Await(absl::Condition(&box_->ready));
    box_->ready = false;
    return std::move(box_->delta);
  }

 private:
  struct Box {
    absl::Mutex mu;
    engine::StreamDelta delta ABSL_GUARDED_BY(mu);
    bool ready ABSL_GUARDED_BY(mu) = false;
  };
  std::shared_ptr<engine::StreamState> stream_;
  // Shared with the sink, which the stream keeps.
  std::shared_ptr<Box> box_ = std::make_shared<Box>();
  bool delivered_ = false;  // a delta was returned and awaits its Ack
};

// Streams the request's text to stdout as it arrives; returns the final
// delta (usage and timings), or the error the request finished with.
absl::StatusOr<engine::StreamDelta> PrintStream(
    const std::shared_ptr<engine::StreamState>& stream) {
  DeltaReader reader(stream);
  for (;;) {
    engine::StreamDelta d = reader.Next();
    std::fputs(d.text.c_str(), stdout);
    std::fflush(stdout);
    if (!d.finished) continue;
    std::fputs("\n", stdout);
    KV_RETURN_IF_ERROR(server::FinishStatus(d.finish_reason, d.error,
                                            /*server_draining=*/false));
    return d;
  }
}

// The stderr summary, from the engine's own usage and timings. The first
// token comes out of the prefill step; decode counts the tokens of the steps
// after it.
void PrintSummary(const engine::StreamDelta& last, uint64_t seed) {
  const engine::Timings& t = last.timings;
  const double prefill_s = t.time_to_first_token - t.queue_seconds;
  const double decode_s = t.total_seconds - t.time_to_first_token;
  const int32_t prompt = last.usage.prompt_tokens;
  const int32_t decoded = std::max(last.usage.completion_tokens - 1, 0);
  std::fprintf(stderr,
               "prefill: %d tokens in %.3f s (%.1f tokens/s)\n"
               "decode: %d tokens in %.3f s (%.1f tokens/s), seed %llu\n",
               prompt, prefill_s, prompt / std::max(prefill_s, 1e-9), decoded,
               decode_s, decoded / std::max(decode_s, 1e-9),
               static_cast<unsigned long long>(seed));
}

// Loads the model for --device, builds the request as the server does and
// an engine sized for it.
absl::StatusOr<std::pair<std::unique_ptr<engine::Engine>, engine::RequestSpec>>
StartEngine(const GenerateFlags& f, const CliArgs& args) {
  engine::EngineConfig e;
  KV_RETURN_IF_ERROR(ApplyEngineFlags(f.engine, kGenerateEngineFlags, &e));
  // One sequence: its KV and nothing more, no watermark kept free for
  // admissions that never come.
  e.scheduler.max_num_seqs = 1;
  e.scheduler.watermark = 0;
  const engine::Device device = engine::ResolveDevice(e.device);
  KV_ASSIGN_OR_RETURN(engine::LoadedModel model,
                      engine::LoadModel(f.engine.model, device));
  const bool chat = f.chat && model.chat_format != models::ChatFormat::kNone;
  // What ServedModelOf gives the server's services for an engine without
  // --max-model-len: requests may reach the model's own context.
  server::ServedModel served;
  served.tokenizer = model.tokenizer.get();
  served.chat_format = model.chat_format;
  served.chat_template = model.chat_template;
  served.max_context = model.config.max_position;
  absl::StatusOr<engine::RequestSpec> spec =
      server::ToRequestSpec(BuildRequest(f, args, chat), served,
                            absl::Uniform<uint64_t>(absl::BitGen()));
  if (!spec.ok()) return ToFlagNames(spec.status(), !f.system.empty());
  // At most the context: the engine refuses a longer request, naming it.
  const int64_t tokens =
      std::min(static_cast<int64_t>(spec->prompt_tokens.size()) +
                   std::max(spec->max_tokens, 1),
               int64_t{served.max_context});
  KV_ASSIGN_OR_RETURN(e.kv_cache_bytes,
                      SequenceKvBytes(model.config, e, device, tokens));
  KV_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                      engine::Engine::Create(e, std::move(model), nullptr));
  return std::make_pair(std::move(engine), *std::move(spec));
}

absl::Status Generate(const GenerateFlags& f, const CliArgs& args) {
  // Engine logs go to stderr, warnings only: stdout is the generated text.
  SetUpLogging("warn");
  if (f.engine.threads > 0) {
    SetNumThreads(static_cast<int>(f.engine.threads));
  }
  const auto t_load = Clock::now();
  KV_ASSIGN_OR_RETURN(auto started, StartEngine(f, args));
  auto& [engine, spec] = started;
  const engine::ModelInfo& info = engine->model_info();
  std::fprintf(stderr, "model: %s (%s) loaded in %.2f s, %d threads\n",
               info.path.c_str(), info.format.c_str(), SecondsSince(t_load),
               NumThreads());
  const uint64_t seed = spec.sampling.seed;
  absl::StatusOr<std::shared_ptr<engine::StreamState>> stream =
      engine->Submit(std::move(spec));
  if (!stream.ok()) {
    return ToFlagNames(server::ToProtoFieldNames(stream.status()),
                       !f.system.empty());
  }
  KV_ASSIGN_OR_RETURN(const engine::StreamDelta last,
                      PrintStream(*std::move(stream)));
  PrintSummary(last, seed);
  return absl::OkStatus();
}

void RegisterFlags(GenerateFlags* f, CliArgs* args) {
  args->SetUsageHeader(
      "usage: kvserve generate --prompt TEXT [flags]\n"
      "One request through the serving engine, as the server runs it: the\n"
      "same prompt rendering, sampling defaults and stop rules.\n");
  RegisterEngineFlags(&f->engine, kGenerateEngineFlags, args);
  args->String("prompt", &f->prompt, "the prompt text (required)");
  args->String("system", &f->system, "system message (chat models)");
  args->Bool("chat", &f->chat,
             "wrap the prompt in the model's chat format when it has one "
             "(default on; --no-chat: raw text)");
  args->Int("max-tokens", &f->max_tokens,
            "tokens to generate (default 16, at most what the context leaves "
            "after the prompt)",
            1, 1 << 24);
  args->Float("temperature", &f->temperature, "0 = greedy (default 1)", 0.0,
              100.0);
  args->Int("top-k", &f->top_k, "0 = off (default 0)", 0, 1 << 30);
  args->Float("top-p", &f->top_p, "nucleus sampling, in (0, 1] (default 1)",
              0.0, 1.0);
  args->Float("min-p", &f->min_p, "min-p sampling (default 0 = off)", 0.0, 1.0);
  args->Float("repetition-penalty", &f->repetition_penalty,
              "in (0, 10] (default 1 = off)", 0.0, 10.0);
  args->Int("seed", &f->seed,
            "random seed (default -1: a random one, printed on stderr)", -1,
            INT64_MAX);
  args->Bool("ignore-eos", &f->ignore_eos,
             "keep going past end of sequence (default off)");
}

}  // namespace

absl::Status ToFlagNames(const absl::Status& status, bool has_system) {
  const FieldRename proto_to_flags[] = {
      {"sampling.max_tokens", "--max-tokens"},
      {"sampling.temperature", "--temperature"},
      {"sampling.top_k", "--top-k"},
      {"sampling.top_p", "--top-p"},
      {"sampling.min_p", "--min-p"},
      {"sampling.repetition_penalty", "--repetition-penalty"},
      {"chat.messages[0].content", has_system ? "--system" : "--prompt"},
      {"chat.messages[1].content", "--prompt"},
      {"chat", "--prompt"},
      {"prompt", "--prompt"},
  };
  return RenameFieldPath(status, proto_to_flags);
}

int RunGenerateCommand(int argc, const char* const* argv) {
  GenerateFlags f;
  bool help = false;
  CliArgs args("generate");
  RegisterFlags(&f, &args);
  args.Bool("help", &help, "show this help");
  absl::Status s = args.Parse(argc, argv, 2);
  if (help) {
    std::fputs(args.Usage().c_str(), stdout);
    return 0;
  }
  if (s.ok() && f.prompt.empty()) {
    s = absl::InvalidArgumentError("--prompt is required");
  }
  if (s.ok()) s = Generate(f, args);
  if (s.ok()) return 0;
  std::fprintf(stderr, "kvserve generate: %s\n",
               std::string(s.message()).c_str());
  // A value the flags or the request checks refuse is a usage error.
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace kvserve::cli
