#include "cli/cli_plan.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/loader/model_files.h"
#include "models/loader/presets.h"
#include "nlohmann/json.hpp"

namespace kvserve::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Result {
  int rc;
  std::string out;
  std::string err;
};

Result RunArgs(const std::vector<std::string>& args,
               const ConfigLoader& loader = nullptr) {
  Result r;
  r.rc = RunPlan(args, loader, &r.out, &r.err);
  return r;
}

// A dense 64-layer GQA model (L=64, H_kv=8, D=128), as a file loader would
// return it.
models::ModelConfig L64Config() {
  models::ModelConfig c;
  c.name = "l64";
  c.architecture = "llama";
  c.num_layers = 64;
  c.hidden_size = 8192;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 22016;
  c.vocab_size = 32000;
  c.max_position = 4096;
  return c;
}

TEST(PlanReportTest, Llama3_70BPerSequence) {
  const Result r = RunArgs({"--model", "llama3-70b"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_THAT(r.out,
              HasSubstr("model            llama3-70b (L=80, H=64, H_kv=8, "
                        "D=128, 70.55B params)\n"
                        "kv dtype         bf16 (2 bytes), tp=1\n"
                        "bytes per token  327,680 (320.0 KiB)\n"
                        "per sequence     8,192 tokens = 2,684,354,560 bytes "
                        "(2.68 GB), 512 blocks of 16\n"
                        "budget           none: pass --memory BYTES or --gpu "
                        "NAME to size concurrency\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("concurrency ")));
  EXPECT_THAT(r.out, Not(HasSubstr("idle KV")));
}

TEST(PlanReportTest, BudgetConcurrencyAndIdleKv) {
  const Result r = RunArgs({"--model=Llama-3-70B", "--memory", "86GB",
                            "--concurrency", "32", "--mean-len=800"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("budget           86,000,000,000 bytes (86.0 "
                               "GB) of KV per rank (--memory)\n"));
  EXPECT_THAT(r.out,
              HasSubstr("concurrency      paged: 32 sequences at full context "
                        "(8,192 tokens), 328 at mean length 800; naive "
                        "max-length reservation: 32\n"));
  EXPECT_THAT(r.out, HasSubstr("requested        32 sequences x 8,192 tokens "
                               "= 85,899,345,920 bytes (85.9 GB): fits the "
                               "budget\n"));
  EXPECT_THAT(r.out, HasSubstr("idle KV          naive reservation at mean "
                               "length 800: 90.2% of reserved KV unused; "
                               "paging: 1.0%\n"));
  const Result over = RunArgs(
      {"--model", "llama3-70b", "--memory", "80GB", "--concurrency", "32"});
  EXPECT_THAT(over.out, HasSubstr("(85.9 GB): exceeds the budget by 5.90 GB"));
}

TEST(PlanReportTest, FileConfigThroughTheLoaderHook) {
  const std::string file =
      ::testing::TempDir() + "/plan_l64_" + std::to_string(getpid()) + ".gguf";
  std::ofstream(file) << "x";
  std::string loaded_path;
  const ConfigLoader loader =
      [&](const std::string& path) -> absl::StatusOr<PlanModel> {
    loaded_path = path;
    return PlanModel{
        .config = L64Config(),
        .weight_bytes_by_type = {{"Q4_K", 3 << 20}, {"F32", 1 << 19}}};
  };
  const Result r = RunArgs({"--model", file, "--kv-dtype", "fp16", "--context",
                            "4096", "--concurrency", "50"},
                           loader);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(loaded_path, file);
  EXPECT_THAT(r.out, HasSubstr("model            " + file + " (L=64"));
  EXPECT_THAT(r.out, HasSubstr("weights          3.5 MiB in the file (F32 0.5, "
                               "Q4_K 3.0 MiB)\n"));
  EXPECT_THAT(r.out, HasSubstr("bytes per token  262,144 (256.0 KiB)\n"));
  EXPECT_THAT(r.out, HasSubstr("per sequence     4,096 tokens = 1,073,741,824 "
                               "bytes (1.07 GB), 256 blocks of 16\n"));
  EXPECT_THAT(r.out, HasSubstr("requested        50 sequences x 4,096 tokens "
                               "= 53,687,091,200 bytes (53.7 GB)\n"));
  // Without a hook, a path is an error that says so.
  const Result unwired = RunArgs({"--model", file});
  EXPECT_EQ(unwired.rc, 1);
  EXPECT_THAT(unwired.err,
              HasSubstr("loading config from files is not wired yet"));
  // Loader errors are reported as they are.
  const Result failing = RunArgs(
      {"--model", file}, [](const std::string&) -> absl::StatusOr<PlanModel> {
        return absl::DataLossError("truncated GGUF header");
      });
  EXPECT_EQ(failing.rc, 1);
  EXPECT_THAT(failing.err, HasSubstr("truncated GGUF header"));
  std::filesystem::remove(file);
}

TEST(PlanReportTest, KvDtypesAndSmallModels) {
  EXPECT_THAT(RunArgs({"--model", "smollm2-135m"}).out,
              HasSubstr("bytes per token  23,040 (22.5 KiB)\n"));
  const Result fp8 =
      RunArgs({"--model", "llama3-70b", "--kv-cache-dtype", "fp8"});
  EXPECT_THAT(fp8.out, HasSubstr("bytes per token  163,840 (160.0 KiB)"));
  EXPECT_THAT(fp8.out, HasSubstr("fp8 (1 byte), tp=1"));
  // int8 and int4 carry an fp16 scale per 32 elements (q8_0 / q4_0).
  const Result i8 = RunArgs({"--model", "llama3-70b", "--kv-dtype", "int8"});
  EXPECT_THAT(i8.out, HasSubstr("bytes per token  174,080 (170.0 KiB)"));
  EXPECT_THAT(i8.out, HasSubstr("int8 (1.0625 bytes), tp=1"));
  const Result i4 = RunArgs({"--model", "llama3-70b", "--kv-dtype", "int4"});
  EXPECT_THAT(i4.out, HasSubstr("bytes per token  92,160 (90.0 KiB)"));
  EXPECT_THAT(RunArgs({"--model", "llama3-70b", "--kv-dtype", "f32"}).out,
              HasSubstr("655,360 (640.0 KiB)"));
  // The default context is the model's max_position when below 8,192.
  EXPECT_THAT(RunArgs({"--model", "llama2-7b"}).out,
              HasSubstr("per sequence     4,096 tokens = 2,147,483,648 bytes "
                        "(2.15 GB)"));
  EXPECT_THAT(RunArgs({"--model", "smollm2-135m"}).out,
              HasSubstr("(L=30, H=9, H_kv=3, D=64, 134.5M params)"));
}

TEST(PlanReportTest, PartialBlocksAreShownPaged) {
  const Result r = RunArgs({"--model", "smollm2-135m", "--context", "1000"});
  EXPECT_THAT(r.out, HasSubstr("1,000 tokens = 23,040,000 bytes (23.0 MB), 63 "
                               "blocks of 16 = 23,224,320 bytes paged\n"));
}

TEST(PlanReportTest, GpuBudgetSubtractsWeightsAndReserve) {
  const Result tp1 = RunArgs({"--model", "llama3-70b", "--gpu", "h200"});
  ASSERT_EQ(tp1.rc, 0) << tp1.err;
  EXPECT_THAT(tp1.out,
              HasSubstr("budget           h200 141 GB HBM - weights 141 GB "
                        "(70.55B params x 2 bytes / tp=1) - reserve 14.1 GB "
                        "(10% for activations) = nothing left for KV\n"));
  EXPECT_THAT(tp1.out, HasSubstr("note             weights"));
  EXPECT_THAT(tp1.out, Not(HasSubstr("concurrency ")));
  // tp=2: 141e9 - 70,553,706,496 - 14.1e9 = 56,346,293,504 bytes per rank;
  // a rank holds 4 of 8 KV heads: 1,342,177,280 bytes per sequence.
  const Result tp2 =
      RunArgs({"--model", "llama3-70b", "--gpu", "H200", "--tp", "2"});
  ASSERT_EQ(tp2.rc, 0) << tp2.err;
  EXPECT_THAT(tp2.out, HasSubstr("tp=2: 4 of 8 KV heads per rank"));
  EXPECT_THAT(tp2.out, HasSubstr("163,840 (160.0 KiB) per rank"));
  EXPECT_THAT(tp2.out, HasSubstr("8,192 tokens = 1,342,177,280 bytes (1.34 "
                                 "GB) per rank, 512 blocks of 16\n"));
  EXPECT_THAT(tp2.out, HasSubstr("= 56,346,293,504 bytes (56.3 GB) of KV per "
                                 "rank: 21,494 blocks (what `kvserve --device "
                                 "sim:h200x2` allocates)\n"));
  EXPECT_THAT(tp2.out, HasSubstr("paged: 41 sequences at full context"));
  // Quantized weights leave more room.
  EXPECT_THAT(RunArgs({"--model", "llama3-70b", "--gpu", "h100", "--tp", "2",
                       "--weight-bytes", "0.5"})
                  .out,
              HasSubstr("x 0.5 bytes / tp=2"));
}

TEST(PlanReportTest, NotesForTpAndSlidingWindow) {
  const Result r = RunArgs({"--model", "llama3-70b", "--tp", "16"});
  EXPECT_THAT(r.out, HasSubstr("40,960 (40.0 KiB) per rank"));
  EXPECT_THAT(r.out, HasSubstr("KV heads are replicated"));
  EXPECT_THAT(RunArgs({"--model", "llama3-70b", "--tp", "3"}).out,
              HasSubstr("tp=3 does not divide the 8 KV heads"));
  EXPECT_THAT(RunArgs({"--model", "mistral-7b", "--context", "32768"}).out,
              HasSubstr("sliding window 4,096: a rolling-buffer cache would "
                        "cap a sequence at 536,870,912 bytes"));
  EXPECT_THAT(RunArgs({"--model", "llama3-8b", "--context", "16384"}).out,
              HasSubstr("exceeds the model's max_position 8,192"));
}

TEST(PlanReportTest, JsonCarriesTheSameNumbers) {
  const Result r =
      RunArgs({"--model", "llama3-70b", "--memory", "86GB", "--concurrency",
               "32", "--mean-len", "800", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["model"], "llama3-70b");
  EXPECT_EQ(j["architecture"]["params"], 70553706496);
  EXPECT_EQ(j["kv_dtype"], "bf16");
  EXPECT_EQ(j["bytes_per_token"], 327680);
  EXPECT_EQ(j["bytes_per_sequence"], 2684354560);
  EXPECT_EQ(j["blocks_per_sequence"], 512);
  EXPECT_EQ(j["budget"]["source"], "memory");
  EXPECT_EQ(j["budget"]["kv_bytes"], 86000000000);
  EXPECT_EQ(j["concurrency"]["paged_at_context"], 32);
  EXPECT_EQ(j["concurrency"]["paged_at_mean"], 328);
  EXPECT_EQ(j["concurrency"]["naive"], 32);
  EXPECT_EQ(j["requested"]["bytes"], 85899345920);
  EXPECT_EQ(j["requested"]["fits"], true);
  EXPECT_NEAR(j["idle"]["naive_fraction"].get<double>(), 0.9023, 1e-4);
  EXPECT_NEAR(j["idle"]["paged_fraction"].get<double>(), 0.0099, 1e-4);
  EXPECT_TRUE(j["notes"].empty());
  const nlohmann::json gpu = nlohmann::json::parse(
      RunArgs({"--model", "qwen2.5-7b", "--gpu", "h100", "--json"}).out);
  EXPECT_EQ(gpu["budget"]["source"], "gpu");
  EXPECT_EQ(gpu["budget"]["hbm_bytes"], 80000000000);
  EXPECT_EQ(gpu["budget"]["weight_bytes_per_rank"], 2 * 7615616512);
}

// --gpu adds the roofline's estimates (models/sim/roofline.h): Llama-3-8B
// bf16 on an H200 reads 15.01 GB of weights a step, 4.17 ms at 0.75 x 4.8
// TB/s, plus its sequences' K/V, plus 4 us of host time per sequence.
TEST(PlanReportTest, GpuAddsRooflineStepTimes) {
  const Result r = RunArgs({"--model", "llama3-8b", "--gpu", "h200",
                            "--context", "4096", "--concurrency", "16"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("roofline         H200 SXM 141GB: 4.80 TB/s x "
                               "0.75, 989 TFLOP/s bf16 x 0.50"));
  // K/V: 16 x 4,096 + 16 tokens x 131,072 bytes = 8.59 GB: 2.39 ms.
  EXPECT_THAT(r.out, HasSubstr("decode step      16 sequences x 4096 tokens: "
                               "6.62 ms a step (weights 4.17 + KV 2.39 ms "
                               "read, 0.55 ms compute, 0.00 ms all-reduce, "
                               "0.06 ms host;"));
  EXPECT_THAT(r.out, HasSubstr("memory-bound), 2417 tokens/s\n"));
  EXPECT_THAT(r.out, HasSubstr("prefill          one 4096-token prompt:"));
  EXPECT_THAT(r.out, HasSubstr("(compute-bound)"));
  const nlohmann::json j = nlohmann::json::parse(
      RunArgs({"--model", "llama3-8b", "--gpu", "h200", "--context", "4096",
               "--concurrency", "16", "--memory-efficiency", "0.4",
               "--host-us-per-seq", "10", "--json"})
          .out);
  EXPECT_NEAR(j["roofline"]["decode_step"]["host_seconds"].get<double>(),
              16 * 10e-6, 1e-12);
  EXPECT_EQ(j["roofline"]["host_us_per_seq"], 10);
  EXPECT_EQ(j["roofline"]["gpu"], "h200");
  EXPECT_EQ(j["roofline"]["decode_sequences"], 16);
  EXPECT_NEAR(j["roofline"]["decode_step"]["weights_seconds"].get<double>(),
              2 * 3.90868e-3, 1e-7);
  EXPECT_FALSE(j["roofline"]["decode_step"]["compute_bound"].get<bool>());
  EXPECT_TRUE(j["roofline"]["prefill"]["compute_bound"].get<bool>());
  // A request that does not fit is estimated at what fits (206 here).
  EXPECT_THAT(RunArgs({"--model", "llama3-8b", "--gpu", "h200", "--context",
                       "4096", "--concurrency", "300"})
                  .out,
              HasSubstr("decode step      206 sequences x 4096 tokens"));
  // Without a GPU there is nothing to estimate.
  EXPECT_FALSE(
      nlohmann::json::parse(
          RunArgs({"--model", "llama3-8b", "--memory", "20GB", "--json"}).out)
          .contains("roofline"));
}

TEST(PlanReportTest, FormatPlanWithoutRunPlan) {
  const models::ModelPreset* preset = models::FindPreset("llama3-70b");
  PlanFlags flags;
  flags.mean_len = 800;
  flags.memory = 86'000'000'000;
  absl::StatusOr<Plan> plan = BuildPlan("llama3-70b", preset->config, flags);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->flags.context, 8192);
  EXPECT_EQ(plan->kv.bytes_per_seq, 2'684'354'560);
  EXPECT_THAT(FormatPlan(*plan), HasSubstr("90.2% of reserved KV unused"));
  flags.mean_len = 9000;
  EXPECT_THAT(BuildPlan("llama3-70b", preset->config, flags).status().message(),
              HasSubstr("--mean-len (9000) must not exceed --context (8192)"));
}

// Usage errors exit 2 with a message naming the flag.
TEST(PlanFlagsTest, BadFlagsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--model", "llama3-70b", "--foo", "1"}, "unknown flag '--foo'"},
      {{"--model", "llama3-70b", "--foo"}, "unknown flag '--foo'"},
      {{"--model", "llama3-70b", "--context", "abc"},
       "invalid value 'abc' for --context"},
      {{"--model", "llama3-70b", "--context", "0"},
       "invalid value '0' for --context"},
      {{"--model", "llama3-70b", "--context"}, "flag --context needs a value"},
      {{"--model", "llama3-70b", "--kv-dtype", "int5"},
       "invalid value 'int5' for --kv-dtype: expected bf16, fp16, fp8, int8, "
       "int4, int3, int2 or f32"},
      {{"--model", "llama3-70b", "--gpu", "b200"},
       "invalid value 'b200' for --gpu: expected one of h100, h200, a100, "
       "l40s"},
      {{"--model", "llama3-8b", "--gpu", "h200", "--memory-efficiency", "1.5"},
       "invalid value '1.5' for --memory-efficiency: expected a fraction in "
       "(0, 1]"},
      {{"--model", "llama3-8b", "--gpu", "h200", "--flops-efficiency", "0"},
       "invalid value '0' for --flops-efficiency: expected a fraction in "
       "(0, 1]"},
      {{"--model", "llama3-70b", "--memory", "lots"},
       "invalid value 'lots' for --memory"},
      {{"--model", "llama3-70b", "--memory", "1GB", "--gpu", "h100"},
       "--memory and --gpu are mutually exclusive"},
      {{"--model", "llama3-70b", "--tp", "0"}, "invalid value '0' for --tp"},
      {{"--model", "llama3-70b", "--block-size", "-16"},
       "invalid value '-16' for --block-size"},
      {{"--model", "llama3-70b", "--weight-bytes", "x"},
       "invalid value 'x' for --weight-bytes"},
      {{"--model", "llama3-70b", "--json=maybe"},
       "invalid value 'maybe' for --json"},
      {{"llama3-70b"}, "unexpected argument 'llama3-70b'"},
      {{"--context", "8192"}, "--model is required"},
      {{"--model", "llama3-70b", "--mean-len", "9000"},
       "--mean-len (9000) must not exceed --context (8192)"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = RunArgs(args);
    EXPECT_EQ(r.rc, 2) << message;
    EXPECT_THAT(r.err, HasSubstr("kvserve plan: " + message));
    EXPECT_EQ(r.out, "");
  }
}

TEST(PlanFlagsTest, ParsesEveryFlag) {
  absl::StatusOr<PlanFlags> f = ParsePlanFlags(
      {"--model", "x", "--kv-dtype=fp8", "--context", "4096", "--concurrency",
       "8", "--memory=1GiB", "--tp", "2", "--block-size", "32", "--mean-len",
       "100", "--weight-bytes", "0.5", "--json"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->model, "x");
  EXPECT_EQ(f->kv_dtype, kvcache::KvDtype::kFP8);
  EXPECT_EQ(f->context, 4096);
  EXPECT_EQ(f->concurrency, 8);
  EXPECT_EQ(f->memory, 1 << 30);
  EXPECT_EQ(f->tp, 2);
  EXPECT_EQ(f->block_size, 32);
  EXPECT_EQ(f->mean_len, 100);
  EXPECT_DOUBLE_EQ(f->weight_bytes, 0.5);
  EXPECT_TRUE(f->json);
  EXPECT_EQ(ParsePlanFlags({"--gpu", "H100"})->gpu, "h100");
}

TEST(PlanFlagsTest, HelpAndModelErrors) {
  const Result help = RunArgs({"--help"});
  EXPECT_EQ(help.rc, 0);
  EXPECT_THAT(help.out, HasSubstr("usage: kvserve plan --model NAME|PATH"));
  EXPECT_THAT(help.out, HasSubstr("llama3.1-405b"));
  for (const char* flag :
       {"--model STRING", "--kv-dtype D", "--context N", "--concurrency N",
        "--memory BYTES", "--gpu NAME", "--tp N", "--block-size N",
        "--mean-len N", "--weight-bytes X", "--memory-efficiency F",
        "--flops-efficiency F", "--json", "--help"}) {
    EXPECT_THAT(help.out, HasSubstr(flag));
  }
  EXPECT_EQ(help.out, PlanUsage());
  const Result h = RunArgs({"--model", "llama3-70b", "-h"});
  EXPECT_EQ(h.rc, 0);
  EXPECT_EQ(h.out, help.out);
  const Result unknown = RunArgs({"--model", "gpt-5"});
  EXPECT_EQ(unknown.rc, 1);
  EXPECT_THAT(unknown.err, HasSubstr("unknown model 'gpt-5'"));
  const Result missing = RunArgs({"--model", "/no/such/model.gguf"});
  EXPECT_EQ(missing.rc, 1);
  EXPECT_THAT(missing.err, HasSubstr("'/no/such/model.gguf' does not exist"));
}

TEST(ByteSizeTest, UnitsAndErrors) {
  const std::vector<std::pair<std::string, int64_t>> good = {
      {"86000000000", 86'000'000'000},
      {"86GB", 86'000'000'000},
      {"86G", 86'000'000'000},
      {"86 gb", 86'000'000'000},
      {"80GiB", int64_t{80} << 30},
      {"80Gi", int64_t{80} << 30},
      {"512 MiB", int64_t{512} << 20},
      {"1.5T", 1'500'000'000'000},
      {"8e10", 80'000'000'000},
      {"100B", 100},
      {"1KB", 1000},
      {"1KiB", 1024},
      {"2 mb", 2'000'000}};
  for (const auto& [text, bytes] : good) {
    absl::StatusOr<int64_t> v = ParseByteSize(text);
    ASSERT_TRUE(v.ok()) << text << ": " << v.status();
    EXPECT_EQ(*v, bytes) << text;
  }
  for (const char* bad :
       {"", "GB", "-1GB", "1XB", "0", "1e", "1.2.3G", "99999999999TB"}) {
    EXPECT_FALSE(ParseByteSize(bad).ok()) << bad;
  }
  EXPECT_EQ(*GpuHbmBytes("h100"), 80'000'000'000);
  EXPECT_EQ(*GpuHbmBytes("H200"), 141'000'000'000);
  EXPECT_FALSE(GpuHbmBytes("v100").ok());
}

// DeepSeek-V3's config.json (MoE and quantization keys included: plan must
// ignore what it does not size).
constexpr char kDeepSeekV3Config[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
  "moe_intermediate_size": 2048, "num_hidden_layers": 61,
  "num_attention_heads": 128, "num_key_value_heads": 128,
  "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8,
  "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
  "rope_theta": 10000, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "rope_scaling": {"type": "yarn", "factor": 40,
                   "original_max_position_embeddings": 4096},
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}})";

constexpr char kDeepSeekV2LiteConfig[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
  "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
  "moe_intermediate_size": 1408, "num_hidden_layers": 27,
  "num_attention_heads": 16, "num_key_value_heads": 16,
  "n_shared_experts": 2, "n_routed_experts": 64, "q_lora_rank": null,
  "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "v_head_dim": 128, "max_position_embeddings": 163840,
  "torch_dtype": "bfloat16"})";

// A directory holding only `config_json` as config.json.
std::string ConfigOnlyDir(const std::string& name, const char* config_json) {
  const std::string dir =
      ::testing::TempDir() + "/plan_" + name + "_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << config_json;
  return dir;
}

// A loader that must not run: MLA directories are read by plan itself.
const ConfigLoader kRefusingLoader =
    [](const std::string& path) -> absl::StatusOr<PlanModel> {
  return absl::InternalError("loader called for " + path);
};

TEST(PlanMlaTest, DeepSeekV3FromConfigJson) {
  const std::string dir = ConfigOnlyDir("dsv3", kDeepSeekV3Config);
  const Result r = RunArgs({"--model", dir}, kRefusingLoader);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("model            " + dir +
                        " (L=61, H=128, MLA kv_lora_rank=512 qk_rope=64 "
                        "qk_nope=128 v=128, params not counted)\n"
                        "kv dtype         bf16 (2 bytes), tp=1\n"
                        "bytes per token  70,272 (68.6 KiB)\n"
                        "attention        MLA: latent 512 + rope 64 per layer; "
                        "as MHA it would need 4,997,120 bytes/token (71.1x)\n"
                        "as MHA           128 KV heads x (K 192 + V 128) x 61 "
                        "layers at bf16\n"
                        "as GQA-8         8 KV heads x (K 192 + V 128) x 61 "
                        "layers at bf16 = 312,320 bytes/token (4.4x)\n"
                        "per sequence     8,192 tokens = 575,668,224 bytes "
                        "(576 MB), 512 blocks of 16\n"));
  EXPECT_THAT(r.out, HasSubstr("note             parameter count not "
                               "computed"));
  const Result j = RunArgs({"--model", dir, "--json"}, kRefusingLoader);
  ASSERT_EQ(j.rc, 0) << j.err;
  const nlohmann::json js = nlohmann::json::parse(j.out);
  EXPECT_EQ(js["attention"], "mla");
  EXPECT_EQ(js["kv_lora_rank"], 512);
  EXPECT_EQ(js["qk_rope_head_dim"], 64);
  EXPECT_EQ(js["bytes_per_token"], 70272);
  EXPECT_EQ(js["mha_equivalent_bytes_per_token"], 4997120);
  EXPECT_EQ(js["gqa8_equivalent_bytes_per_token"], 312320);
  EXPECT_TRUE(js["architecture"]["params"].is_null());
  EXPECT_EQ(nlohmann::json::parse(
                RunArgs({"--model", "llama3-70b", "--json"}).out)["attention"],
            "gqa");
}

TEST(PlanMlaTest, DeepSeekV3QuantizedAndTensorParallel) {
  const std::string dir = ConfigOnlyDir("dsv3q", kDeepSeekV3Config);
  const Result q = RunArgs({"--model", dir, "--kv-dtype", "int8"});
  ASSERT_EQ(q.rc, 0) << q.err;
  EXPECT_THAT(q.out, HasSubstr("bytes per token  37,332 (36.5 KiB)\n"));
  const Result tp = RunArgs({"--model", dir, "--tp", "8", "--memory", "80GB"});
  ASSERT_EQ(tp.rc, 0) << tp.err;
  EXPECT_THAT(tp.out, HasSubstr("tp=8: the whole MLA latent on every rank\n"
                                "bytes per token  70,272 (68.6 KiB) per "
                                "rank\n"));
  // MHA at tp=8 splits its 128 heads: 16 per rank.
  EXPECT_THAT(tp.out, HasSubstr("as MHA it would need 624,640 bytes/token per "
                                "rank (8.9x)"));
  EXPECT_THAT(tp.out, HasSubstr("the MLA latent is not split across heads"));
  const Result gpu = RunArgs({"--model", dir, "--gpu", "h200"});
  EXPECT_EQ(gpu.rc, 2);
  EXPECT_THAT(gpu.err, HasSubstr("pass the KV budget with --memory"));
}

TEST(PlanMlaTest, DeepSeekV2Lite) {
  const std::string dir = ConfigOnlyDir("dsv2lite", kDeepSeekV2LiteConfig);
  const Result r = RunArgs({"--model", dir, "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["bytes_per_token"], 27 * 576 * 2);
  EXPECT_EQ(j["mha_equivalent_bytes_per_token"], 27 * 16 * 320 * 2);
  EXPECT_EQ(j["gqa8_equivalent_bytes_per_token"], 27 * 8 * 320 * 2);
  const Result text = RunArgs({"--model", dir});
  EXPECT_THAT(text.out,
              HasSubstr("bytes per token  31,104 (30.4 KiB)\n"
                        "attention        MLA: latent 512 + rope 64 per layer; "
                        "as MHA it would need 276,480 bytes/token (8.9x)\n"));
}

TEST(PlanMlaTest, ServingAnMlaDirIsRefusedNamingMla) {
  const std::string dir = ConfigOnlyDir("dsv3serve", kDeepSeekV3Config);
  models::OpenModelFilesOptions options;
  options.check_weights = false;
  const absl::StatusOr<models::ModelFiles> files =
      models::OpenModelFiles(dir, options);
  ASSERT_FALSE(files.ok());
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(files.status().message(),
              HasSubstr("DeepseekV3ForCausalLM uses multi-head latent "
                        "attention (MLA), which kvserve cannot load or serve"));
}

TEST(RunPlanCommandTest, PrintsToStdout) {
  // As main() calls it: {"kvserve", "plan", flags...}.
  const char* argv[] = {"kvserve", "plan", "--model", "llama3-70b"};
  ::testing::internal::CaptureStdout();
  int rc = RunPlanCommand(4, argv);
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("2,684,354,560 bytes (2.68 GB)"));
  // Without the subcommand token, flags start at argv[1].
  const char* bare[] = {"kvserve-plan", "--model", "smollm2-135m"};
  ::testing::internal::CaptureStdout();
  rc = RunPlanCommand(3, bare);
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(out, HasSubstr("23,040 (22.5 KiB)"));
}

}  // namespace
}  // namespace kvserve::cli
