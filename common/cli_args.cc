#include "common/cli_args.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvserve {

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  // The number (digits, '.', an exponent as in "8e10"), then the unit.
  size_t split = 0;
  while (split < t.size() &&
         (absl::ascii_isdigit(t[split]) || t[split] == '.' || t[split] == 'e' ||
          t[split] == 'E' || t[split] == '+')) {
    ++split;
  }
  double number = 0;
  std::string unit(absl::StripAsciiWhitespace(t.substr(split)));
  absl::AsciiStrToLower(&unit);
  if (unit.size() > 1 && unit.back() == 'b') unit.pop_back();
  static constexpr std::pair<const char*, double> kUnits[] = {
      {"", 1.0},
      {"b", 1.0},
      {"k", 1e3},
      {"m", 1e6},
      {"g", 1e9},
      {"t", 1e12},
      {"ki", 1024.0},
      {"mi", 1048576.0},
      {"gi", 1073741824.0},
      {"ti", 1099511627776.0}};
  if (split > 0 && absl::SimpleAtod(t.substr(0, split), &number)) {
    for (const auto& [name, scale] : kUnits) {
      if (unit != name) continue;
      const double bytes = std::floor(number * scale);
      if (!(bytes >= 0 && bytes <= 1.0e18)) break;
      return static_cast<int64_t>(bytes);
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "not a byte size: '%s' (use e.g. 4096, 512MiB, 80GB)", text));
}

void CliArgs::Add(const std::string& name, const std::string& help,
                  std::string value_hint, std::string expected,
                  std::function<bool(const std::string&)> set) {
  Flag f;
  f.name = name;
  f.help = help;
  f.value_hint = std::move(value_hint);
  f.is_bool = f.value_hint.empty();
  f.expected = std::move(expected);
  f.set = std::move(set);
  flags_.push_back(std::move(f));
}

void CliArgs::String(const std::string& name, std::string* dst,
                     const std::string& help) {
  Add(name, help, "STRING", "", [dst](const std::string& v) {
    *dst = v;
    return true;
  });
}

void CliArgs::Int(const std::string& name, int64_t* dst,
                  const std::string& help, int64_t min, int64_t max) {
  Add(name, help, "N", absl::StrFormat("an integer in [%d, %d]", min, max),
      [=](const std::string& v) {
        int64_t x = 0;
        if (!absl::SimpleAtoi(v, &x) || x < min || x > max) return false;
        *dst = x;
        return true;
      });
}

void CliArgs::Float(const std::string& name, double* dst,
                    const std::string& help, double min, double max) {
  Add(name, help, "X", absl::StrFormat("a number in [%g, %g]", min, max),
      [=](const std::string& v) {
        double x = 0;
        if (!absl::SimpleAtod(v, &x) || !(x >= min && x <= max)) return false;
        *dst = x;
        return true;
      });
}

void CliArgs::Bool(const std::string& name, bool* dst,
                   const std::string& help) {
  Add(name, help, /*value_hint=*/"", "true or false",
      [dst](const std::string& v) { return absl::SimpleAtob(v, dst); });
}

void CliArgs::Bytes(const std::string& name, int64_t* dst,
                    const std::string& help) {
  Add(name, help, "BYTES", "a byte size such as 4096, 512MiB or 80GB",
      [dst](const std::string& v) {
        absl::StatusOr<int64_t> b = ParseBytes(v);
        if (!b.ok()) return false;
        *dst = *b;
        return true;
      });
}

void CliArgs::Custom(const std::string& name, const std::string& value_hint,
                     const std::string& help, std::string expected,
                     std::function<bool(const std::string&)> set) {
  Add(name, help, value_hint.empty() ? "VALUE" : value_hint,
      std::move(expected), std::move(set));
}

CliArgs::Flag* CliArgs::Find(const std::string& name) {
  for (Flag& f : flags_) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

bool CliArgs::Seen(const std::string& name) const {
  for (const Flag& f : flags_) {
    if (f.name == name) return f.seen;
  }
  return false;
}

absl::Status CliArgs::Parse(int argc, const char* const* argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" && Find("help") != nullptr) arg = "--help";
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "unexpected argument '%s' (flags start with --; run 'kvserve %s "
          "--help')",
          arg, command_));
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    bool negated = false;
    Flag* f = Find(name);
    if (f == nullptr && name.rfind("no-", 0) == 0) {
      f = Find(name.substr(3));
      negated = f != nullptr && f->is_bool;
      if (!negated) f = nullptr;
    }
    if (f == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "unknown flag '--%s' (run 'kvserve %s --help')", name, command_));
    }
    if (negated) {
      value = "false";
    } else if (!has_value && f->is_bool) {
      value = "true";
    } else if (!has_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "flag --%s needs a value (%s)", name, f->value_hint));
      }
      value = argv[++i];
    }
    f->seen = true;
    if (!f->set(value)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("invalid value '%s' for --%s: expected %s", value,
                          f->name, f->expected));
    }
  }
  return absl::OkStatus();
}

std::string CliArgs::Usage() const {
  std::string out =
      header_.empty() ? absl::StrCat("usage: kvserve ", command_, " [flags]\n")
                      : header_;
  for (const Flag& f : flags_) {
    absl::StrAppendFormat(&out, "  --%-24s %s\n",
                          f.is_bool ? f.name : f.name + " " + f.value_hint,
                          f.help);
  }
  return out;
}

}  // namespace kvserve
