// GrammarCompiler: turns a request's GrammarSpec into a CompiledGrammar for
// the model's vocabulary with XGrammar (its token masks precomputed), off
// the engine thread, bounded and cached.
//
// Bounds, since a compile cannot be cancelled and a schema comes from a
// client: a source larger than max_source_bytes or more than max_choices
// choices is refused before compiling; at most max_concurrent compiles run
// at once (each on a thread of its own; a caller past the cap gets
// RESOURCE_EXHAUSTED at once, never a queue); a caller waits at most
// `timeout` (DEADLINE_EXCEEDED) while its compile runs on to completion,
// holding its slot, and lands in the cache. Compiled grammars are cached by
// GrammarSpec::Key (least recently used out past cache_bytes), so a
// repeated schema compiles once.
//
// Errors: INVALID_ARGUMENT naming GrammarSpec::field and XGrammar's reason
// (an unparsable schema, regex or grammar, an unsatisfiable schema).
//
// Thread safety: Compile and stats from any thread. A CompiledGrammar is
// immutable and shared by every sequence that uses it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grammar/grammar_spec.h"

namespace kvserve::models {
class Tokenizer;
}  // namespace kvserve::models

namespace kvserve::grammar {

// A grammar compiled against one vocabulary; opaque outside grammar/.
class CompiledGrammar {
 public:
  struct Impl;
  explicit CompiledGrammar(std::unique_ptr<Impl> impl);
  ~CompiledGrammar();
  CompiledGrammar(const CompiledGrammar&) = delete;
  CompiledGrammar& operator=(const CompiledGrammar&) = delete;

  [[nodiscard]] GrammarKind kind() const;
  [[nodiscard]] int64_t memory_bytes() const;
  [[nodiscard]] const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct GrammarCompilerOptions {
  int32_t max_concurrent = 2;  // compiles running at once
  absl::Duration timeout = absl::Seconds(10);
  int64_t max_source_bytes = 64 * 1024;
  int32_t max_choices = 256;
  int64_t cache_bytes = int64_t{256} << 20;
  // XGrammar's threads per compile (its token-mask precomputation).
  int32_t compile_threads = 1;
};

struct GrammarCompilerStats {
  int64_t compiles = 0;    // compiles finished (ok or not)
  int64_t failures = 0;    // of them, refused by XGrammar
  int64_t cache_hits = 0;  // Compile calls served from the cache
  int64_t timeouts = 0;    // callers that stopped waiting
  int64_t busy = 0;        // callers refused at the concurrency cap
  int64_t refused = 0;     // sources over the input limits
  double compile_seconds = 0.0;
  int64_t cache_bytes = 0;
  int32_t cache_entries = 0;
  int32_t running = 0;
};

class GrammarCompiler {
 public:
  // `vocab_size`: the model's logits width (at least the tokenizer's; ids
  // past it are never allowed). The model's end-of-generation tokens end a
  // constrained output once the grammar is complete.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<GrammarCompiler>> Create(
      const models::Tokenizer& tokenizer, int32_t vocab_size,
      const GrammarCompilerOptions& options);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  [[nodiscard]] absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(
      const GrammarSpec& spec);
  [[nodiscard]] GrammarCompilerStats stats() const;
  [[nodiscard]] int32_t vocab_size() const { return vocab_size_; }
  [[nodiscard]] const GrammarCompilerOptions& options() const {
    return options_;
  }

 private:
  struct Shared;
  GrammarCompiler(std::shared_ptr<Shared> shared, int32_t vocab_size,
                  const GrammarCompilerOptions& options);
  [[nodiscard]] absl::Status CheckLimits(const GrammarSpec& spec) const;

  std::shared_ptr<Shared> shared_;  // also held by running compile threads
  int32_t vocab_size_;
  GrammarCompilerOptions options_;
};

}  // namespace kvserve::grammar
