#include "common/cli_args.h"

#include <cmath>
#include <cstdlib>

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

void CliArgs::String(const std::string& name, std::string* dst,
                     const std::string& help) {
  flags_.push_back(
      {name, help, "STRING", false, false, [dst](const std::string& v) {
         *dst = v;
         return absl::OkStatus();
       }});
}

void CliArgs::Int(const std::string& name, int64_t* dst,
                  const std::string& help, int64_t min, int64_t max) {
  flags_.push_back(
      {name, help, "N", false, false, [=](const std::string& v) {
         int64_t x;
         if (!absl::SimpleAtoi(v, &x) || x < min || x > max) {
           return absl::InvalidArgumentError(absl::StrFormat(
               "--%s: '%s' must be an integer in [%d, %d]", name, v, min, max));
         }
         *dst = x;
         return absl::OkStatus();
       }});
}

void CliArgs::Float(const std::string& name, double* dst,
                    const std::string& help, double min, double max) {
  flags_.push_back(
      {name, help, "X", false, false, [=](const std::string& v) {
         double x;
         if (!absl::SimpleAtod(v, &x) || !(x >= min && x <= max)) {
           return absl::InvalidArgumentError(absl::StrFormat(
               "--%s: '%s' must be a number in [%g, %g]", name, v, min, max));
         }
         *dst = x;
         return absl::OkStatus();
       }});
}

void CliArgs::Bool(const std::string& name, bool* dst,
                   const std::string& help) {
  flags_.push_back({name, help, "", true, false, [=](const std::string& v) {
                      if (v == "true" || v == "1" || v.empty()) {
                        *dst = true;
                      } else if (v == "false" || v == "0") {
                        *dst = false;
                      } else {
                        return absl::InvalidArgumentError(absl::StrFormat(
                            "--%s: '%s' must be true or false", name, v));
                      }
                      return absl::OkStatus();
                    }});
}

void CliArgs::Bytes(const std::string& name, int64_t* dst,
                    const std::string& help) {
  flags_.push_back(
      {name, help, "BYTES", false, false, [=](const std::string& v) {
         absl::StatusOr<int64_t> b = ParseBytes(v);
         if (!b.ok()) {
           return absl::InvalidArgumentError(
               absl::StrCat("--", name, ": ", b.status().message()));
         }
         *dst = *b;
         return absl::OkStatus();
       }});
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
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: unexpected argument '%s' (flags look like --name value)",
          command_, arg));
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
          "%s: unknown flag --%s (see --help)", command_, name));
    }
    if (!has_value && !f->is_bool) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: flag --%s needs a value (%s)", command_, name, f->value_hint));
      }
      value = argv[++i];
    }
    if (negated) value = "false";
    f->seen = true;
    absl::Status s = f->set(value);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string CliArgs::Usage() const {
  std::string out = absl::StrCat("usage: kvserve ", command_, " [flags]\n");
  for (const Flag& f : flags_) {
    absl::StrAppendFormat(&out, "  --%-24s %s\n",
                          f.is_bool ? f.name : f.name + " " + f.value_hint,
                          f.help);
  }
  return out;
}

}  // namespace kvserve
