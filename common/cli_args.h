// A small command-line parser for kvserve's subcommands: `--name value` and
// `--name=value`, typed destinations, and errors that name the flag and the
// expected form. Testable (no globals, no exit()).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvserve {

class CliArgs {
 public:
  explicit CliArgs(std::string command) : command_(std::move(command)) {}

  // Register flags; `help` is shown by Usage().
  void String(const std::string& name, std::string* dst,
              const std::string& help);
  void Int(const std::string& name, int64_t* dst, const std::string& help,
           int64_t min, int64_t max);
  void Float(const std::string& name, double* dst, const std::string& help,
             double min, double max);
  void Bool(const std::string& name, bool* dst, const std::string& help);
  // Byte sizes: plain numbers or suffixed (KB, MB, GB, KiB, MiB, GiB, ...).
  void Bytes(const std::string& name, int64_t* dst, const std::string& help);

  // Parses argv[first..argc). InvalidArgument names the offending flag.
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
    std::function<absl::Status(const std::string&)> set;
  };
  Flag* Find(const std::string& name);

  std::string command_;
  std::vector<Flag> flags_;
};

// Parses a byte size: a number (decimal or exponent form) and an optional
// unit: B, K/KB, M/MB, G/GB, T/TB (powers of 1000), KiB, MiB, GiB, TiB
// (powers of 1024), case-insensitive ("80GB", "1.5GiB", "4096").
[[nodiscard]] absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

}  // namespace kvserve
