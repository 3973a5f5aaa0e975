// Tenants: who sends a request, and what the daemon lets each of them do.
// Owns the token file format (--auth-token-file), the mapping of a bearer
// token to its tenant, and each tenant's policy: the priority range its
// clients' values are clamped to, its fair-share weight, its caps, and its
// prefix-cache scope. Does not own the HTTP or gRPC header checks
// (auth.h) nor the enforcement (the server clamps and checks; the engine
// and scheduler share and cap).
//
// The token file, one token per line ('#' starts a comment line, blank
// lines are skipped); after the token, optional `key=value` fields:
//
//   <token> [tenant=NAME] [priority=LO..HI] [weight=N] [max_running=N]
//           [max_queued=N] [max_request_tokens=N] [cache_scope=NAME] [admin]
//
// A line with a token alone (today's format) is a tenant of its own, named
// `token-<line number>`: the safe reading, since nothing says two tokens
// belong together. Several lines naming one tenant are that tenant's
// tokens; a field may be given on any of them, but never two different
// values. Fields left out take the server's defaults (TenantDefaults).
// `cache_scope`: tenants naming the same scope share cached prefixes
// (whole blocks only, see Tenant::scope_shared); by default a tenant's
// scope is its own. `admin`: sees every tenant's requests in /v1/kv/state.
//
// Invariants: tokens are kept only as SHA-256 digests and compared with
// CRYPTO_memcmp against every digest, so the time taken depends neither on
// how much of a token matched nor on which one did. No error message
// contains a token or the text of a line (only its number).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvserve::server {

// A tenant's limits; 0 in a cap means the server's own limit only.
struct TenantLimits {
  // Client priorities are clamped to [priority_min, priority_max]; an
  // unset priority is 0 clamped to it.
  int32_t priority_min = -10;
  int32_t priority_max = 10;
  // Share of running sequences and of each step's prefill tokens among
  // tenants with work (1..1000).
  int32_t weight = 1;
  int32_t max_running = 0;  // sequences running at once
  int32_t max_queued = 0;   // completions waiting to start
  // prompt + n x max_tokens summed over one API call's prompts.
  int64_t max_request_tokens = 0;
};

struct Tenant {
  std::string name;  // [A-Za-z0-9_.-]{1,64}; a metric label
  // The prefix-cache scope key: requests share cached KV only within one
  // scope (and one cache_salt inside it). Private scopes and named ones
  // never collide ("tenant:NAME" vs "scope:NAME").
  std::string cache_scope;
  // More than one tenant uses the scope: hits and cached_tokens are whole
  // blocks only there (no token-granular tails, which would answer "does
  // the next token of someone else's prompt equal mine?").
  bool scope_shared = false;
  bool admin = false;  // /v1/kv/state shows every tenant
  TenantLimits limits;
};
using TenantRef = std::shared_ptr<const Tenant>;

// What a tenant gets for a field its lines leave out.
struct TenantDefaults {
  TenantLimits limits;
};

// The single tenant of a daemon without a token file: every client is it;
// its scope is private (token-granular hits) and it sees all of the KV
// state.
[[nodiscard]] TenantRef SingleTenant(const TenantDefaults& defaults);

// An immutable token -> tenant table (one load of the token file).
class TenantTable {
 public:
  // Parses the token file's text. InvalidArgument naming `source` (the
  // flag and path) and the line number for a malformed line.
  [[nodiscard]] static absl::StatusOr<TenantTable> Parse(
      absl::string_view text, const TenantDefaults& defaults,
      const std::string& source);
  // Reads and parses `path`; InvalidArgument naming `flag` and the path.
  [[nodiscard]] static absl::StatusOr<TenantTable> FromFile(
      const std::string& path, const TenantDefaults& defaults,
      const std::string& flag = "--auth-token-file");

  [[nodiscard]] int num_tokens() const {
    return static_cast<int>(entries_.size());
  }
  [[nodiscard]] int num_tenants() const {
    return static_cast<int>(tenants_.size());
  }
  [[nodiscard]] const std::vector<TenantRef>& tenants() const {
    return tenants_;
  }
  // The tenant of `token`, or null. Constant time in the token.
  [[nodiscard]] TenantRef Find(absl::string_view token) const;

 private:
  using Digest = std::array<uint8_t, 32>;
  struct Entry {
    Digest digest;
    int32_t tenant;  // index into tenants_
  };
  std::vector<Entry> entries_;
  std::vector<TenantRef> tenants_;
};

// "LO..HI" or "N" (both ends N) -> [lo, hi]; InvalidArgument naming
// `field` otherwise (also when lo > hi).
[[nodiscard]] absl::Status ParsePriorityRange(absl::string_view text,
                                              const std::string& field,
                                              int32_t* lo, int32_t* hi);

}  // namespace kvserve::server
