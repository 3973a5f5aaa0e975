// KvEventRelay: the engine's side of KV cache events (kvevents/). After
// every engine iteration it turns the KV manager's record of keys that
// became findable or stopped being findable into one event batch for the
// publisher: BlockStored for a run of full blocks of one chain (computed,
// or loaded from a tier into the pool), BlockRemoved for evicted or purged
// ones, AllBlocksCleared once at start (a restarted replica's index starts
// empty). The medium is "GPU" for the engine's pool, on every device, "CPU"
// for a device's host cache and "STORAGE" for the replica's disk tier
// (AttachTiers). The shared remote
// tier is not announced: every replica reaches it alike, so it would add
// the same score to each.
//
// Scope: a router keys blocks by token ids alone, so it cannot tell a
// tenant's private scope or a cache_salt from the shared default. Announced
// are the blocks of the default scope and of scopes several tenants share
// (server/tenants.h), without a cache_salt: within them, a router's match
// is a hit for every tenant of the scope. A private scope's or a salted
// block announced as such would send other tenants to a replica that cannot
// serve them a hit, and would tell the router (and whoever reads the
// stream) that tenant's prompts. With `private_scopes_model` set
// (--kv-events-private-scopes), a private scope's unsalted blocks are
// announced under the LoRA name "<model>@<scope>", which llm-d keys
// instead of the model: only a request the router attributes to that name
// (the tenant's identity, mapped at the gateway) can match them. Salted
// blocks are never announced. A removal is published only for a key that
// was announced.
//
// Wire hashes are the low 64 bits of the pool's 128-bit chain keys.
//
// Engine thread only, but for ResidentHashes and stats.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/kv_tiers.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_cache_manager.h"
#include "kvevents/publisher.h"
#include "kvtier/tier.h"

namespace kvserve::engine {

struct KvEventStats {
  kvevents::PublisherStats publisher;
  int64_t announced_blocks = 0;    // announced and not removed since
  int64_t stored_blocks = 0;       // in BlockStored events, ever
  int64_t removed_blocks = 0;      // in BlockRemoved events, ever
  int64_t unannounced_blocks = 0;  // registered outside the default scope
  // Engine-thread CPU time spent turning records into batches and queuing
  // them (the records themselves are made inside the step).
  int64_t engine_cpu_nanos = 0;
};

class KvEventRelay {
 public:
  // `model_id`: the scheduler's, which every namespace hashes.
  // `private_scopes_model`: the router's model name, to announce private
  // scopes under "<it>@<scope>"; empty: private scopes are not announced.
  KvEventRelay(std::unique_ptr<kvevents::Publisher> publisher,
               int32_t block_size, std::string model_id,
               std::string private_scopes_model = "");

  // Starts recording on `kv` (engine thread, before the first request) and
  // queues AllBlocksCleared.
  void Attach(kvcache::KvCacheManager* kv);
  // Also announces the tiers' blocks: the host cache's (a device's pinned
  // host memory, medium CPU) and the disk tier's (medium STORAGE), those
  // stored from now on, and their removal. Files indexed at start stay
  // unannounced until loaded into the pool (their tokens are in the files
  // only), so a router underrates a restarted replica's disk, never
  // overrates it.
  void AttachTiers(KvTiers* tiers);
  // A request is admitted: its namespace is announced from now on when it
  // is the default scope or a shared one (or a private one, opted in),
  // without a salt.
  void NoteRequest(const std::string& cache_scope, bool scope_shared,
                   const std::string& cache_salt);
  // Publishes what changed since the last call (nothing when nothing did),
  // then answers pending ResidentHashes calls.
  void Relay();
  // Any thread: the resident blocks as of the engine's next iteration
  // (after the events before it were queued). DeadlineExceeded after
  // `timeout`.
  [[nodiscard]] absl::StatusOr<ResidentBlocks> ResidentHashes(
      absl::Duration timeout);
  [[nodiscard]] KvEventStats stats() const;

  [[nodiscard]] static uint64_t WireHash(kvcache::BlockHash key) {
    return absl::Uint128Low64(key);
  }

 private:
  // A tier's medium and the keys announced in it.
  struct TierMedium {
    kvevents::Medium medium;
    absl::flat_hash_set<kvcache::BlockHash>* announced;
  };
  kvevents::EventBatch Collect(const std::vector<kvcache::KvEvent>& events,
                               const KvTiers::Changes& tiers);
  void AnswerDumps();

  std::unique_ptr<kvevents::Publisher> publisher_;
  const int32_t block_size_;
  const std::string model_id_;
  const std::string private_scopes_model_;
  // Namespaces announced, with the LoRA name their blocks carry (none for
  // the default's and shared scopes').
  absl::flat_hash_map<kvcache::BlockHash, std::optional<std::string>>
      announced_ns_;
  kvcache::KvCacheManager* kv_ = nullptr;
  KvTiers* tiers_ = nullptr;
  absl::flat_hash_set<kvcache::BlockHash> announced_;       // engine thread
  absl::flat_hash_set<kvcache::BlockHash> announced_host_;  // engine thread
  absl::flat_hash_set<kvcache::BlockHash> announced_disk_;  // engine thread

  mutable std::mutex mu_;
  KvEventStats stats_;  // guarded by mu_ (but publisher)
  std::vector<std::shared_ptr<std::promise<ResidentBlocks>>> dumps_;
};

}  // namespace kvserve::engine
