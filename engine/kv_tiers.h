// KvTiers: the engine's side of the KV tiers below the pool (kvtier/).
//
// Up to three tiers: on a device backend (CUDA) a host cache in pinned
// memory (kvtier/host_tier.h, the bytes the backend's HostKvCopier moves),
// the disk (kvtier/disk_tier.h) and a remote Redis/Valkey that replicas
// share (kvtier/remote_tier.h). Where the pool is in host memory (CPU) the
// lower tiers read and write pool blocks directly; on a device they stage
// through the host cache (kv_tiers_host.cc): a block reaches the disk and
// the remote from its host slot, and a disk or remote hit is read into
// host slots, then copied to the device.
//
// Stores (write-through): after each step, the blocks the prefix cache
// registered are copied out of the pool on the engine thread (a memcpy per
// layer slab, one copy shared by both tiers) and queued for each tier's
// writer; a queue that is full drops the block, counted, never waits.
// Blocks loaded from the remote tier are written to the disk too.
//
// Loads: a new request's full prompt blocks are looked up past the pool's
// own match (same chain keys): the disk's run from its index, then, when a
// remote tier is on and healthy, the rest from the remote (its GETs are
// the probe). The tiers hold the request back (its loading state), lend
// fresh pool blocks to a loader thread and let the engine keep stepping.
// When the load completes (or its deadline passes) the verified blocks are
// registered as cached and the request enters the scheduler, whose prefix
// match then finds them like any cached prefix. The step never waits on a
// disk or a network.
//
// Keys: the scheduler's model id becomes kvtier::ModelIdFor(salt), the salt
// covering the weights' fingerprint and the KV format, so the pool's chain
// keys are the tier keys. Engine thread only, but for the wake callback.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/engine.h"
#include "engine/kv_state.h"
#include "engine/runner/model_backend.h"
#include "kvtier/disk_tier.h"
#include "kvtier/host_tier.h"
#include "kvtier/remote_tier.h"
#include "kvtier/tier_loader.h"
#include "scheduler/scheduler.h"

namespace kvserve::engine {

class TierMetrics;

struct KvTierStats {
  bool has_host = false, has_disk = false, has_remote = false;
  kvtier::TierStats host;
  kvtier::TierStats disk;
  kvtier::TierStats remote;
  int64_t loading_requests = 0;
  int64_t loads = 0;           // loads started
  int64_t loaded_blocks = 0;   // verified and registered
  int64_t load_deadlines = 0;  // loads cut short by their deadline (disk)
  int64_t remote_load_deadlines = 0;  // ... while reading the remote
  int64_t skipped_slower = 0;   // not loaded: predicted slower than compute
  int64_t skipped_no_room = 0;  // not loaded: no free pool blocks
  double load_seconds_per_block = 0;
  // Thread CPU the engine thread spent in the tiers' calls (lookups and
  // load starts at admission, finished loads, write-through copies).
  int64_t engine_cpu_nanos = 0;
};

class KvTiers {
 public:
  // A request whose load ended: it enters the scheduler now.
  struct Ready {
    RequestId id = 0;
    std::unique_ptr<scheduler::Request> request;
    int32_t host_tokens = 0;  // prompt tokens its load registered, by tier
    int32_t disk_tokens = 0;
    int32_t remote_tokens = 0;
    double load_seconds = 0;
  };

  // Opens the configured tiers for `model` on `backend`. FailedPrecondition
  // when the backend's KV is not in host memory; the disk tier's errors.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KvTiers>> Create(
      const KvTierConfig& config, const LoadedModel& model,
      const ModelBackend& backend, std::function<void()> wake,
      TierMetrics* metrics = nullptr);
  ~KvTiers();

  // The prefix cache's model id under the tiers' salt.
  [[nodiscard]] const std::string& model_id() const { return model_id_; }
  // Before the first request: the scheduler whose pool the tiers fill.
  void Attach(scheduler::Scheduler* scheduler);

  // Starts a load of r's prompt blocks past the pool's match when the disk
  // holds some; true: the tiers keep `r` until TakeReady hands it back.
  [[nodiscard]] bool MaybeLoad(std::unique_ptr<scheduler::Request>& r,
                               absl::Time now);
  [[nodiscard]] std::vector<Ready> TakeReady();
  // Lets go of the blocks a finished load holds for request `id`: once it
  // is scheduled (its table holds them), ends, or waited longer than
  // kMaxHold (so holds never starve the pool). Cheap when nothing is held.
  void Release(RequestId id);
  void ReleaseStale(absl::Time now);
  // Copies the newly cached blocks down (after each step's registration).
  void StoreNewlyCached();
  // Waits for queued stores up to `deadline` (the host cache's copies first:
  // the engine thread hands them down as they finish); returns the blocks
  // dropped.
  int64_t Flush(absl::Time deadline);
  // Deletes the stored blocks of a cache scope (and salt within it), and
  // makes the pool's unreferenced blocks of it unfindable; nullopt matches
  // any. Any thread: the disk and remote tiers are thread-safe, and the
  // pool's and host cache's part waits for the engine thread (up to 5 s).
  [[nodiscard]] absl::StatusOr<KvTierPurge> Purge(
      const std::optional<std::string>& cache_scope,
      const std::optional<std::string>& cache_salt) const;
  // Cancels and joins the loads (before the backend's memory goes).
  void Stop();

  // KV events: the host cache and the disk tier log what they hold and
  // drop from now on (kvtier::HostTier/DiskTier::RecordChanges);
  // TakeChanges hands the logs over (empty for a tier that is off).
  struct Changes {
    std::vector<kvtier::TierChange> host;
    std::vector<kvtier::TierChange> disk;
  };
  void RecordChanges();
  [[nodiscard]] Changes TakeChanges();

  [[nodiscard]] KvTierStats stats() const;
  // Every held request has a load in the pool and vice versa; the disk
  // index's bytes are its blocks'.
  [[nodiscard]] absl::Status CheckInvariants() const;
  // The tiers for /v1/kv/state.
  [[nodiscard]] std::vector<KvStateTier> StateOf() const;
  [[nodiscard]] int64_t loading() const {
    return static_cast<int64_t>(loading_.size());
  }
  // Host cache copies in flight (the engine polls them while idle).
  [[nodiscard]] bool copies_in_flight() const {
    return !host_stores_.empty() || device_loads_ > 0;
  }

 private:
  struct Loading {
    std::unique_ptr<scheduler::Request> request;
    int32_t first_block = 0;  // the pool's match
    kvcache::BlockHash parent = kvcache::kNoParentHash;
    kvcache::BlockHash ns = 0;
    int32_t disk_blocks = 0;  // the job's first blocks come from the disk
    // With both tiers on, the job's keys and pool blocks: what the remote
    // brings in is written to the disk once verified.
    std::vector<kvcache::BlockHash> keys;
    std::vector<kvcache::BlockId> fresh;
    uint64_t scope_tag = 0;
    // On a device: the host cache's run (copied first), the slots the lower
    // tiers' blocks are read into, and the copy to the pool in flight.
    std::vector<int32_t> host_slots;
    std::vector<int32_t> staged;
    int32_t loaded = 0;  // lower-tier blocks verified
    bool loader_running = false;
    int64_t ticket = 0;
    double loader_seconds = 0;
    absl::Time start;
  };
  // Store copies to the host cache in flight, oldest first.
  struct HostStore {
    int64_t ticket = 0;
    std::vector<int32_t> slots;
  };
  KvTiers(const KvTierConfig& config, const ModelBackend& backend,
          kvtier::BlockFormat format);

  [[nodiscard]] absl::Status OpenDisk(const KvTierConfig& config,
                                      TierMetrics* metrics);
  [[nodiscard]] absl::Status OpenRemote(const KvTierConfig& config,
                                        TierMetrics* metrics);
  // kv_tiers_host.cc: the device path.
  // Starts the copies of a load on a device; false when nothing started
  // (every host pin and reservation undone).
  [[nodiscard]] bool StartDeviceLoad(Loading& l, kvtier::LoadJob& job,
                                     absl::Span<const kvcache::BlockId> fresh);
  // A loader result of a device load: its verified blocks go to the pool.
  void OnDeviceLoaded(Loading& l, const kvtier::LoadResult& res);
  // Finished device loads, registered.
  void TakeDeviceReady(std::vector<Ready>* ready);
  // Starts copies of newly cached blocks to the host cache.
  void StoreToHost(std::vector<kvcache::CachedBlockRecord> records);
  // Commits the finished store copies and hands them to the lower tiers.
  void PollHostStores();
  // Registers the verified blocks of a finished load; its Ready.
  Ready Finish(RequestId id, Loading& l, int32_t verified, double seconds);
  // Queues `item` on the disk (when it lacks the block) and the remote.
  void StoreBelow(kvtier::StoreItem item);
  // A block's bytes for the writers, and what keeps them valid.
  struct Payload {
    absl::Span<const uint8_t> bytes;
    std::shared_ptr<const void> owner;
  };
  // A copy of pool block `block` (host pools: a memcpy per layer slab).
  [[nodiscard]] Payload PayloadOfBlock(kvcache::BlockId block) const;
  // Host cache slot `slot` itself, pinned until the last writer lets go
  // (no copy: on a GPU a step's blocks may be hundreds of MiB).
  [[nodiscard]] Payload PayloadOfSlot(int32_t slot);
  // Unpins the slots the writers let go of.
  void UnpinReturnedSlots();
  // How many of the prompt's blocks [m, full) to load, from which tiers;
  // 0 when none.
  [[nodiscard]] int32_t PlanLoad(absl::Span<const kvcache::BlockHash> keys,
                                 uint64_t scope_tag, kvcache::BlockHash ns,
                                 int32_t* disk_blocks);
  // A block's bytes as a tier's store item.
  [[nodiscard]] kvtier::StoreItem ItemOf(Payload payload,
                                         kvcache::BlockHash key,
                                         kvcache::BlockHash parent,
                                         kvcache::BlockHash ns,
                                         uint64_t scope_tag,
                                         std::vector<int32_t> tokens) const;

  const KvTierConfig config_;
  const ModelBackend& backend_;
  const kvtier::BlockFormat format_;
  const kvtier::Key salt_;
  const std::string model_id_;
  scheduler::Scheduler* scheduler_ = nullptr;
  std::shared_ptr<const kvtier::BlockCipher> cipher_;  // null: not sealed
  // The pool's and the host cache's part of purges asked from other
  // threads (both are engine thread only): applied by TakeReady.
  struct EnginePurge {
    std::optional<uint64_t> scope_tag, salt_tag;
    std::promise<std::pair<int64_t, int64_t>> blocks;  // pool, host
  };
  void ApplyEnginePurges();
  mutable std::mutex purge_mu_;
  mutable std::vector<std::shared_ptr<EnginePurge>> engine_purges_;
  std::function<void()> wake_;
  HostKvCopier* copier_ = nullptr;  // a device backend's host cache
  std::unique_ptr<kvtier::HostTier> host_;
  std::deque<HostStore> host_stores_;
  // Slots whose store items the writers released (any thread appends).
  struct SlotReturns {
    std::mutex mu;
    std::vector<int32_t> slots;
  };
  std::shared_ptr<SlotReturns> slot_returns_ = std::make_shared<SlotReturns>();
  // Its size, for Flush on another thread.
  std::atomic<int64_t> pending_host_stores_{0};
  int32_t device_loads_ = 0;  // loads with a host copy in flight or queued
  std::unique_ptr<kvtier::DiskTier> disk_;
  std::unique_ptr<kvtier::RemoteTier> remote_;
  std::unique_ptr<kvtier::TierLoader> loader_;
  absl::flat_hash_map<RequestId, Loading> loading_;
  // Loaded, waiting in the scheduler: since when their blocks are held.
  absl::flat_hash_map<RequestId, absl::Time> held_;
  // Namespace -> scope tag of the requests seen (a block's file name and
  // purge tag); bounded.
  absl::flat_hash_map<kvcache::BlockHash, uint64_t> scope_tags_;
  KvTierStats stats_;
};

}  // namespace kvserve::engine
