// KvTiers on a device backend (CUDA): the host cache (kvtier/host_tier.h)
// in the backend's pinned slots (HostKvCopier), and the lower tiers staged
// through it.
//
// Stores: each step's newly cached blocks get a host slot (pending) and a
// copy to it on the side stream; a copy the staging cannot take yet is
// dropped, counted. When a copy is done (polled, never waited for) its
// slots commit: they are hits from then on, and their bytes are handed to
// the disk and the remote tier like a CPU pool block's.
//
// Loads: the host cache's run is copied straight into the fresh pool
// blocks; the disk's and the remote's blocks are read by the loader into
// reserved host slots, verified, committed (a lower-tier hit is a host hit
// next time) and copied to the pool. The request enters the scheduler once
// every copy of its load is done, so no forward reads a block in flight.
#include <cstring>
#include <utility>

#include "engine/kv_tiers.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

// A copy the device refused: its state is unknown, as after a failed
// forward (the backend aborts there too).
HostKvCopier::Copy OrDie(absl::StatusOr<HostKvCopier::Copy> c) {
  if (!c.ok()) {
    spdlog::critical("kv host cache: {}", c.status().ToString());
    spdlog::default_logger()->flush();
    std::abort();
  }
  return *c;
}

}  // namespace

KvTiers::Payload KvTiers::PayloadOfSlot(int32_t slot) {
  host_->Pin(slot);
  const uint8_t* bytes = copier_->slot(slot);
  std::shared_ptr<SlotReturns> returns = slot_returns_;
  // Runs on whichever thread drops the last copy of the item.
  std::shared_ptr<const void> lease(bytes, [returns, slot](const void*) {
    std::lock_guard<std::mutex> lock(returns->mu);
    returns->slots.push_back(slot);
  });
  return {absl::MakeConstSpan(bytes, format_.payload_bytes), std::move(lease)};
}

void KvTiers::UnpinReturnedSlots() {
  std::vector<int32_t> slots;
  {
    std::lock_guard<std::mutex> lock(slot_returns_->mu);
    slots.swap(slot_returns_->slots);
  }
  for (const int32_t s : slots) host_->Unpin(s);
}

bool KvTiers::StartDeviceLoad(Loading& l, kvtier::LoadJob& job,
                              absl::Span<const kvcache::BlockId> fresh) {
  // Host slots for the lower tiers' blocks: a block the disk holds may
  // evict a host block; a speculative remote read takes free slots only.
  for (size_t i = 0; i < job.blocks.size(); ++i) {
    kvtier::LoadBlock& b = job.blocks[i];
    kvtier::HostTier::Entry e{b.key, b.parent, job.ns, job.scope_tag, b.tokens};
    const std::optional<int32_t> s =
        host_->Reserve(std::move(e), /*evict=*/!b.remote);
    if (!s.has_value()) {
      job.blocks.resize(i);
      l.keys.resize(i);
      l.fresh.resize(i);
      break;
    }
    b.dst = {{copier_->slot(*s), static_cast<size_t>(format_.payload_bytes)}};
    l.staged.push_back(*s);
  }
  l.disk_blocks =
      std::min(l.disk_blocks, static_cast<int32_t>(job.blocks.size()));
  if (l.host_slots.empty() && job.blocks.empty()) return false;
  std::vector<HostKvCopier::Move> moves;
  moves.reserve(l.host_slots.size());
  for (size_t i = 0; i < l.host_slots.size(); ++i) {
    moves.push_back({l.host_slots[i], fresh[i]});
  }
  const HostKvCopier::Copy c = OrDie(copier_->CopyFromHost(moves));
  l.ticket = c.ticket;
  ++device_loads_;
  return true;
}

void KvTiers::OnDeviceLoaded(Loading& l, const kvtier::LoadResult& res) {
  l.loader_running = false;
  l.loaded = res.verified;
  l.loader_seconds = res.seconds;
  std::vector<HostKvCopier::Move> moves;
  for (size_t j = 0; j < l.staged.size(); ++j) {
    const int32_t s = l.staged[j];
    if (static_cast<int32_t>(j) >= res.verified) {
      host_->Abandon(s);
      continue;
    }
    host_->Commit(s);  // a verified block: a host hit from now on
    host_->Pin(s);     // until its copy to the pool is done
    moves.push_back({s, l.fresh[j]});
    // What the remote brought in goes to the disk too.
    if (disk_ != nullptr && static_cast<int32_t>(j) >= l.disk_blocks) {
      const kvtier::HostTier::Entry& e = host_->entry(s);
      (void)disk_->Store(ItemOf(PayloadOfSlot(s), e.key, e.parent, e.ns,
                                e.scope_tag, e.tokens));
    }
  }
  l.staged.resize(moves.size());
  const HostKvCopier::Copy c = OrDie(copier_->CopyFromHost(moves));
  l.ticket = c.ticket;
}

void KvTiers::TakeDeviceReady(std::vector<Ready>* ready) {
  std::vector<RequestId> done;
  for (auto& [id, l] : loading_) {
    if (!l.loader_running && copier_->CopyDone(l.ticket)) done.push_back(id);
  }
  for (const RequestId id : done) {
    auto it = loading_.find(id);
    Loading l = std::move(it->second);
    loading_.erase(it);
    --device_loads_;
    for (const int32_t s : l.host_slots) host_->Unpin(s);
    for (const int32_t s : l.staged) host_->Unpin(s);
    const auto verified = static_cast<int32_t>(l.host_slots.size()) + l.loaded;
    ready->push_back(
        Finish(id, l, verified, absl::ToDoubleSeconds(absl::Now() - l.start)));
  }
}

void KvTiers::StoreToHost(std::vector<kvcache::CachedBlockRecord> records) {
  PollHostStores();
  std::vector<HostKvCopier::Move> moves;
  std::vector<int32_t> slots;
  // What the staging cannot take now is dropped before it takes a slot
  // (and evicts a block for nothing).
  const int32_t room = records.empty() ? 0 : copier_->store_capacity();
  for (kvcache::CachedBlockRecord& rec : records) {
    auto tag = scope_tags_.find(rec.ns);
    if (tag == scope_tags_.end()) continue;  // a namespace no longer known
    if (static_cast<int32_t>(moves.size()) >= room) {
      if (!host_->Contains(rec.key)) {
        host_->DropStore(kvtier::DropReason::kQueueFull);
      }
      continue;
    }
    const std::optional<int32_t> s = host_->Reserve(
        {rec.key, rec.parent, rec.ns, tag->second, std::move(rec.tokens)},
        /*evict=*/true);
    if (!s.has_value()) continue;  // held already, or counted as dropped
    moves.push_back({rec.block, *s});
    slots.push_back(*s);
  }
  if (moves.empty()) return;
  const HostKvCopier::Copy c = OrDie(copier_->CopyToHost(moves));
  for (size_t i = c.accepted; i < slots.size(); ++i) {
    host_->Abandon(slots[i]);
    host_->DropStore(kvtier::DropReason::kQueueFull);
  }
  slots.resize(c.accepted);
  if (!slots.empty()) host_stores_.push_back({c.ticket, std::move(slots)});
  pending_host_stores_.store(static_cast<int64_t>(host_stores_.size()));
}

void KvTiers::PollHostStores() {
  UnpinReturnedSlots();
  while (!host_stores_.empty() &&
         copier_->CopyDone(host_stores_.front().ticket)) {
    for (const int32_t s : host_stores_.front().slots) {
      host_->Commit(s);
      if (disk_ == nullptr && remote_ == nullptr) continue;
      const kvtier::HostTier::Entry& e = host_->entry(s);
      if (remote_ == nullptr && disk_->Contains(e.key)) continue;
      StoreBelow(ItemOf(PayloadOfSlot(s), e.key, e.parent, e.ns, e.scope_tag,
                        e.tokens));
    }
    host_stores_.pop_front();
  }
  pending_host_stores_.store(static_cast<int64_t>(host_stores_.size()));
}

}  // namespace kvserve::engine
