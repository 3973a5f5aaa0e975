#include "server/tenants.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"

namespace kvserve::server {
namespace {

constexpr absl::string_view kUnnamedPrefix = "token-";
constexpr size_t kMaxNameBytes = 64;

// Printable ASCII without spaces: what fits in an HTTP header and a gRPC
// metadata value unchanged.
bool IsTokenChar(char c) { return c > 0x20 && c < 0x7f; }

bool IsNameChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
         c == '.' || c == '-';
}

bool IsValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

// One tenant being assembled from its lines: each field's value as written
// and the line that gave it, so a conflicting second value names both.
struct Draft {
  Tenant tenant;
  std::map<std::string, std::pair<std::string, int>> fields;
  std::string scope_name;  // cache_scope=, empty: private
};

class Parser {
 public:
  Parser(const TenantDefaults& defaults, const std::string& source)
      : defaults_(defaults), source_(source) {}

  absl::Status Line(absl::string_view line, int line_no);

  std::vector<std::pair<std::array<uint8_t, 32>, std::string>> tokens;
  std::vector<std::string> order;  // tenant names, first appearance
  std::map<std::string, Draft> drafts;

 private:
  absl::Status Error(int line_no, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, " line ", line_no, ": ", what));
  }
  absl::Status Field(Draft& d, absl::string_view key, absl::string_view value,
                     int line_no);
  absl::Status Number(absl::string_view key, absl::string_view value,
                      int64_t lo, int64_t hi, int line_no, int64_t* out) const;

  const TenantDefaults& defaults_;
  const std::string& source_;
  std::vector<int> token_lines_;
};

absl::Status Parser::Number(absl::string_view key, absl::string_view value,
                            int64_t lo, int64_t hi, int line_no,
                            int64_t* out) const {
  if (!absl::SimpleAtoi(value, out) || *out < lo || *out > hi) {
    return Error(line_no, absl::StrCat(key, ": must be an integer in [", lo,
                                       ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status Parser::Field(Draft& d, absl::string_view key,
                           absl::string_view value, int line_no) {
  auto [it, fresh] =
      d.fields.try_emplace(std::string(key), std::string(value), line_no);
  if (!fresh) {
    if (it->second.first == value) return absl::OkStatus();
    return Error(line_no,
                 absl::StrCat("tenant '", d.tenant.name, "': ", key,
                              " differs from line ", it->second.second));
  }
  TenantLimits& l = d.tenant.limits;
  int64_t n = 0;
  if (key == "priority") {
    return ParsePriorityRange(value, absl::StrCat(source_, " line ", line_no),
                              &l.priority_min, &l.priority_max);
  }
  if (key == "weight") {
    KV_RETURN_IF_ERROR(Number(key, value, 1, 1000, line_no, &n));
    l.weight = static_cast<int32_t>(n);
  } else if (key == "max_running") {
    KV_RETURN_IF_ERROR(Number(key, value, 1, 1 << 20, line_no, &n));
    l.max_running = static_cast<int32_t>(n);
  } else if (key == "max_queued") {
    KV_RETURN_IF_ERROR(Number(key, value, 1, 1 << 24, line_no, &n));
    l.max_queued = static_cast<int32_t>(n);
  } else if (key == "max_request_tokens") {
    KV_RETURN_IF_ERROR(Number(key, value, 1, int64_t{1} << 40, line_no, &n));
    l.max_request_tokens = n;
  } else if (key == "cache_scope") {
    if (!IsValidName(value)) {
      return Error(line_no, "cache_scope: 1 to 64 of [A-Za-z0-9_.-]");
    }
    d.scope_name = std::string(value);
  } else if (key == "admin") {
    d.tenant.admin = true;
  } else {
    return Error(line_no,
                 absl::StrCat("unknown field '", key,
                              "' (tenant, priority, weight, max_running, "
                              "max_queued, max_request_tokens, cache_scope, "
                              "admin)"));
  }
  return absl::OkStatus();
}

absl::Status Parser::Line(absl::string_view line, int line_no) {
  std::vector<absl::string_view> fields =
      absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  const absl::string_view token = fields[0];
  for (char c : token) {
    if (!IsTokenChar(c)) {
      return Error(line_no, "a token must be printable ASCII without spaces");
    }
  }
  std::string name = absl::StrCat(kUnnamedPrefix, line_no);
  std::vector<std::pair<absl::string_view, absl::string_view>> rest;
  for (size_t i = 1; i < fields.size(); ++i) {
    const size_t eq = fields[i].find('=');
    const absl::string_view key = fields[i].substr(0, eq);
    const absl::string_view value =
        eq == absl::string_view::npos ? "" : fields[i].substr(eq + 1);
    if (key == "tenant") {
      if (!IsValidName(value) || absl::StartsWith(value, kUnnamedPrefix)) {
        return Error(line_no,
                     "tenant: 1 to 64 of [A-Za-z0-9_.-], not starting with "
                     "'token-' (the names of unnamed tokens)");
      }
      name = std::string(value);
    } else if ((key == "admin") != (eq == absl::string_view::npos)) {
      return Error(line_no, absl::StrCat("field ", i + 1,
                                         ": expected key=value or 'admin'"));
    } else {
      rest.emplace_back(key, value);
    }
  }
  std::array<uint8_t, 32> digest;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         digest.data());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (CRYPTO_memcmp(tokens[i].first.data(), digest.data(), 32) == 0) {
      return Error(line_no,
                   absl::StrCat("the same token as line ", token_lines_[i]));
    }
  }
  tokens.emplace_back(digest, name);
  token_lines_.push_back(line_no);
  auto [it, fresh] = drafts.try_emplace(name);
  Draft& d = it->second;
  if (fresh) {
    order.push_back(name);
    d.tenant.name = name;
    d.tenant.limits = defaults_.limits;
  }
  for (const auto& [key, value] : rest) {
    KV_RETURN_IF_ERROR(Field(d, key, value, line_no));
  }
  return absl::OkStatus();
}

}  // namespace

TenantRef SingleTenant(const TenantDefaults& defaults) {
  auto t = std::make_shared<Tenant>();
  t->name = "default";
  t->cache_scope = "";
  t->admin = true;
  t->limits = defaults.limits;
  return t;
}

absl::Status ParsePriorityRange(absl::string_view text,
                                const std::string& field, int32_t* lo,
                                int32_t* hi) {
  const size_t dots = text.find("..");
  int32_t a = 0;
  int32_t b = 0;
  const bool ok = dots == absl::string_view::npos
                      ? absl::SimpleAtoi(text, &a) && (b = a, true)
                      : absl::SimpleAtoi(text.substr(0, dots), &a) &&
                            absl::SimpleAtoi(text.substr(dots + 2), &b);
  if (!ok || a > b) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": priority range must be LO..HI (LO <= HI) or N, got '", text,
        "'"));
  }
  *lo = a;
  *hi = b;
  return absl::OkStatus();
}

absl::StatusOr<TenantTable> TenantTable::Parse(absl::string_view text,
                                               const TenantDefaults& defaults,
                                               const std::string& source) {
  Parser p(defaults, source);
  int line_no = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_no;
    const absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line[0] == '#') continue;
    KV_RETURN_IF_ERROR(p.Line(line, line_no));
  }
  if (p.tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " holds no token (one per line; '#' starts a comment)"));
  }
  // Scopes: private unless named; named ones used by several tenants are
  // shared.
  absl::flat_hash_map<std::string, int> users;
  for (auto& [name, d] : p.drafts) {
    d.tenant.cache_scope = d.scope_name.empty()
                               ? absl::StrCat("tenant:", name)
                               : absl::StrCat("scope:", d.scope_name);
    ++users[d.tenant.cache_scope];
  }
  TenantTable table;
  absl::flat_hash_map<std::string, int32_t> index;
  for (const std::string& name : p.order) {
    Draft& d = p.drafts.at(name);
    d.tenant.scope_shared = users[d.tenant.cache_scope] > 1;
    index[name] = static_cast<int32_t>(table.tenants_.size());
    table.tenants_.push_back(std::make_shared<const Tenant>(d.tenant));
  }
  for (const auto& [digest, name] : p.tokens) {
    table.entries_.push_back({digest, index.at(name)});
  }
  return table;
}

absl::StatusOr<TenantTable> TenantTable::FromFile(
    const std::string& path, const TenantDefaults& defaults,
    const std::string& flag) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "'"));
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), defaults, absl::StrCat(flag, ": '", path, "'"));
}

TenantRef TenantTable::Find(absl::string_view token) const {
  Digest d;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(),
         d.data());
  // Every digest is compared, whatever matched before.
  int32_t found = -1;
  for (const Entry& e : entries_) {
    const int match = CRYPTO_memcmp(e.digest.data(), d.data(), d.size()) == 0;
    found = match ? e.tenant : found;
  }
  return found < 0 ? nullptr : tenants_[found];
}

}  // namespace kvserve::server
