// A small command-line parser for kvserve's subcommands: `--name value` and
// `--name=value`, typed destinations, and errors that name the flag and the
// expected form. Testable (no globals, no exit()).
//
// Every error is InvalidArgument in one of these forms (no command prefix:
// the caller adds its own):
//   invalid value 'V' for --NAME: expected WHAT
//   unknown flag '--NAME' (run 'kvserve CMD --help')
//   flag --NAME needs a value (HINT)
//   unexpected argument 'ARG' (flags start with --; run 'kvserve CMD --help')
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvserve {

class CliArgs {
 public:
  explicit CliArgs(std::string command) : command_(std::move(command)) {}

  // Register flags; `help` is shown by Usage(). A bool flag takes no value
  // (`--name`), `--no-name`, or `--name=V` with V as absl::SimpleAtob reads
  // it (true/false, 1/0, yes/no, ...).
  void String(const std::string& name, std::string* dst,
              const std::string& help);
  void Int(const std::string& name, int64_t* dst, const std::string& help,
           int64_t min, int64_t max);
  void Float(const std::string& name, double* dst, const std::string& help,
             double min, double max);
  void Bool(const std::string& name, bool* dst, const std::string& help);
  // Byte sizes: plain numbers or suffixed (KB, MB, GB, KiB, MiB, GiB, ...).
  void Bytes(const std::string& name, int64_t* dst, const std::string& help);
  // A flag whose value `set` parses and stores: it returns false for a value
  // it refuses, and the error reads "invalid value 'V' for --NAME: expected
  // `expected`". `value_hint` stands for the value in Usage() ("D",
  // "h100|h200"; empty: "VALUE").
  void Custom(const std::string& name, const std::string& value_hint,
              const std::string& help, std::string expected,
              std::function<bool(const std::string&)> set);

  // Replaces the first line of Usage(), "usage: kvserve COMMAND [flags]",
  // with `header` (one or more lines, each ending in '\n').
  void SetUsageHeader(std::string header) { header_ = std::move(header); }

  // Parses argv[first..argc) in order and stops at the first error
  // (InvalidArgument naming the offending flag, above). `-h` stands for
  // `--help` when a "help" flag is registered.
  [[nodiscard]] absl::Status Parse(int argc, const char* const* argv,
                                   int first = 1);
  std::string Usage() const;
  // True if the flag appeared on the command line.
  bool Seen(const std::string& name) const;

 private:
  struct Flag {
    std::string name, help, value_hint;
    bool is_bool = false;
    bool seen = false;
    std::string expected;  // what a refused value should have been
    std::function<bool(const std::string&)> set;  // false: value refused
  };
  // A flag with an empty `value_hint` is a bool flag (takes no value).
  void Add(const std::string& name, const std::string& help,
           std::string value_hint, std::string expected,
           std::function<bool(const std::string&)> set);
  Flag* Find(const std::string& name);

  std::string command_;
  std::string header_;  // empty: "usage: kvserve COMMAND [flags]"
  std::vector<Flag> flags_;
};

// Parses a byte size: a number (decimal or exponent form) and an optional
// unit: B, K/KB, M/MB, G/GB, T/TB (powers of 1000), KiB, MiB, GiB, TiB
// (powers of 1024), case-insensitive ("80GB", "1.5GiB", "4096").
[[nodiscard]] absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

}  // namespace kvserve
