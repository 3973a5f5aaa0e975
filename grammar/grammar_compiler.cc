// GrammarCompiler: XGrammar compiles on threads of their own, bounded and
// cached. See grammar_compiler.h.
#include "grammar/grammar_compiler.h"

#include <list>
#include <string>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grammar/grammar_internal.h"
#include "models/tokenizer/tokenizer.h"

namespace kvserve::grammar {

CompiledGrammar::CompiledGrammar(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
CompiledGrammar::~CompiledGrammar() = default;
GrammarKind CompiledGrammar::kind() const { return impl_->kind; }
int64_t CompiledGrammar::memory_bytes() const { return impl_->bytes; }

namespace {

using Compiled = std::shared_ptr<const CompiledGrammar>;

// An EBNF string literal of `text` (UTF-8 passes through; quotes,
// backslashes and control bytes are escaped, the latter as fixed-width
// \uXXXX since XGrammar's \x takes any number of hex digits).
std::string EbnfLiteral(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += absl::StrFormat("\\u%04x", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Runs XGrammar's compile of `spec`; its exceptions become
// INVALID_ARGUMENT naming the spec's field.
absl::StatusOr<xgrammar::CompiledGrammar> RunCompile(
    xgrammar::GrammarCompiler& compiler, const GrammarSpec& spec) {
  try {
    switch (spec.kind) {
      case GrammarKind::kJsonObject:
        // Any object: not strict (its properties are the model's choice).
        return compiler.CompileJSONSchema(R"({"type": "object"})",
                                          /*any_whitespace=*/false,
                                          std::nullopt, std::nullopt,
                                          /*strict_mode=*/false);
      case GrammarKind::kJsonSchema:
        // Compact separators, no free whitespace: a small model cannot
        // loop on blank space. Strict (vLLM's default): no properties or
        // items the schema does not name.
        return compiler.CompileJSONSchema(spec.source,
                                          /*any_whitespace=*/false);
      case GrammarKind::kRegex:
        return compiler.CompileRegex(spec.source);
      case GrammarKind::kEbnf:
        return compiler.CompileGrammar(spec.source, "root");
      case GrammarKind::kStructuralTag:
        return compiler.CompileStructuralTag(spec.source);
      case GrammarKind::kChoice: {
        std::string ebnf = "root ::= ";
        for (size_t i = 0; i < spec.choices.size(); ++i) {
          if (i > 0) ebnf += " | ";
          ebnf += EbnfLiteral(spec.choices[i]);
        }
        return compiler.CompileGrammar(ebnf, "root");
      }
    }
  } catch (const std::exception& e) {
    return FromException(spec.field, e);
  }
  return absl::InvalidArgumentError(absl::StrCat(spec.field, ": unknown kind"));
}

}  // namespace

struct GrammarCompiler::Shared {
  Shared(xgrammar::GrammarCompiler c, int32_t vocab, std::vector<int32_t> eog,
         int64_t limit)
      : compiler(std::move(c)),
        vocab_size(vocab),
        eog_ids(std::move(eog)),
        cache_limit(limit) {}

  struct Entry {
    Compiled grammar;
    std::list<std::string>::iterator lru;
  };
  // One compile's result, handed from its thread to its caller.
  struct Job {
    absl::Notification done;
    absl::StatusOr<Compiled> result;
  };

  // Inserts `g` under `key`, dropping the least recently used entries past
  // the byte limit (a grammar larger than the limit is not kept).
  void Insert(const std::string& key, Compiled g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (cache.contains(key) || g->memory_bytes() > cache_limit) return;
    lru.push_front(key);
    stats.cache_bytes += g->memory_bytes();
    cache.emplace(key, Entry{std::move(g), lru.begin()});
    while (stats.cache_bytes > cache_limit && !lru.empty()) {
      auto it = cache.find(lru.back());
      stats.cache_bytes -= it->second.grammar->memory_bytes();
      cache.erase(it);
      lru.pop_back();
    }
    stats.cache_entries = static_cast<int32_t>(cache.size());
  }

  // The compile thread's body.
  void Run(const GrammarSpec& spec, const std::shared_ptr<Job>& job) {
    const absl::Time t0 = absl::Now();
    absl::StatusOr<xgrammar::CompiledGrammar> r = RunCompile(compiler, spec);
    absl::StatusOr<Compiled> out = absl::UnknownError("");
    if (!r.ok()) {
      out = r.status();
    } else {
      auto impl = std::make_unique<CompiledGrammar::Impl>(CompiledGrammar::Impl{
          *std::move(r), spec.kind, 0, vocab_size, eog_ids});
      impl->bytes = static_cast<int64_t>(impl->compiled.MemorySizeBytes());
      out = Compiled(std::make_shared<CompiledGrammar>(std::move(impl)));
    }
    {
      absl::MutexLock lock(&mu);
      --stats.running;
      ++stats.compiles;
      stats.compile_seconds += absl::ToDoubleSeconds(absl::Now() - t0);
      if (out.ok()) {
        Insert(spec.Key(), *out);
      } else {
        ++stats.failures;
      }
    }
    job->result = std::move(out);
    job->done.Notify();
  }

  xgrammar::GrammarCompiler compiler;  // thread-safe
  const int32_t vocab_size;
  const std::vector<int32_t> eog_ids;
  const int64_t cache_limit;
  mutable absl::Mutex mu;
  std::list<std::string> lru ABSL_GUARDED_BY(mu);  // front: most recent
  absl::flat_hash_map<std::string, Entry> cache ABSL_GUARDED_BY(mu);
  GrammarCompilerStats stats ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<GrammarCompiler>> GrammarCompiler::Create(
    const models::Tokenizer& tokenizer, int32_t vocab_size,
    const GrammarCompilerOptions& options) {
  if (vocab_size < tokenizer.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", vocab_size,
                                                   " is below the tokenizer's ",
                                                   tokenizer.vocab_size()));
  }
  if (options.max_concurrent < 1 || options.compile_threads < 1 ||
      options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "grammar compiler: max_concurrent, compile_threads and timeout must "
        "be positive");
  }
  // Each token as the bytes it decodes to (RAW: XGrammar takes them as
  // they are); control tokens as "", which XGrammar never allows inside a
  // match. The end-of-generation tokens end a complete match.
  std::vector<std::string> vocab(tokenizer.vocab_size());
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.IsEog(id)) eog.push_back(id);
    if (!tokenizer.IsSpecial(id)) vocab[id] = tokenizer.TokenToPiece(id);
  }
  if (eog.empty()) {
    return absl::FailedPreconditionError(
        "structured output needs the model's end-of-generation token; the "
        "tokenizer names none");
  }
  try {
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, vocab_size,
                                 eog);
    // XGrammar's own cache off: ours (Shared::cache) counts its hits.
    xgrammar::GrammarCompiler compiler(info, options.compile_threads,
                                       /*cache_enabled=*/false);
    auto shared = std::make_shared<Shared>(std::move(compiler), vocab_size,
                                           std::move(eog), options.cache_bytes);
    return std::unique_ptr<GrammarCompiler>(
        new GrammarCompiler(std::move(shared), vocab_size, options));
  } catch (const std::exception& e) {
    return FromException("grammar compiler", e);
  }
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<Shared> shared,
                                 int32_t vocab_size,
                                 const GrammarCompilerOptions& options)
    : shared_(std::move(shared)), vocab_size_(vocab_size), options_(options) {}

GrammarCompiler::~GrammarCompiler() = default;

absl::Status GrammarCompiler::CheckLimits(const GrammarSpec& spec) const {
  if (spec.kind == GrammarKind::kChoice) {
    if (spec.choices.empty() ||
        static_cast<int64_t>(spec.choices.size()) > options_.max_choices) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.field, ": between 1 and ", options_.max_choices,
                       " choices, got ", spec.choices.size()));
    }
    int64_t bytes = 0;
    for (const std::string& c : spec.choices) {
      if (c.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(spec.field, ": a choice is empty"));
      }
      bytes += static_cast<int64_t>(c.size());
    }
    if (bytes > options_.max_source_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          spec.field, ": the choices hold ", bytes,
          " bytes, more than the limit of ", options_.max_source_bytes));
    }
    return absl::OkStatus();
  }
  if (spec.kind != GrammarKind::kJsonObject && spec.source.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(spec.field, ": empty"));
  }
  if (static_cast<int64_t>(spec.source.size()) > options_.max_source_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.field, ": ", spec.source.size(), " bytes, more than the limit of ",
        options_.max_source_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::Compile(
    const GrammarSpec& spec) {
  if (absl::Status s = CheckLimits(spec); !s.ok()) {
    absl::MutexLock lock(&shared_->mu);
    ++shared_->stats.refused;
    return s;
  }
  const std::string key = spec.Key();
  auto job = std::make_shared<Shared::Job>();
  {
    absl::MutexLock lock(&shared_->mu);
    if (auto it = shared_->cache.find(key); it != shared_->cache.end()) {
      shared_->lru.splice(shared_->lru.begin(), shared_->lru, it->second.lru);
      ++shared_->stats.cache_hits;
      return it->second.grammar;
    }
    if (shared_->stats.running >= options_.max_concurrent) {
      ++shared_->stats.busy;
      return absl::ResourceExhaustedError(absl::StrCat(
          spec.field, ": ", shared_->stats.running,
          " grammars are compiling, the limit (--structured-output-max-"
          "compiles); retry later"));
    }
    ++shared_->stats.running;
  }
  // The thread holds `shared_` and the job: a caller that stops waiting,
  // or a compiler destroyed meanwhile, leaves it valid.
  std::thread([shared = shared_, spec, job] {
    shared->Run(spec, job);
  }).detach();
  if (!job->done.WaitForNotificationWithTimeout(options_.timeout)) {
    absl::MutexLock lock(&shared_->mu);
    ++shared_->stats.timeouts;
    return absl::DeadlineExceededError(
        absl::StrCat(spec.field, ": compiling took longer than ",
                     absl::FormatDuration(options_.timeout),
                     " (it finishes in the background and is cached)"));
  }
  return job->result;
}

GrammarCompilerStats GrammarCompiler::stats() const {
  absl::MutexLock lock(&shared_->mu);
  return shared_->stats;
}

}  // namespace kvserve::grammar
