#include "engine/kv_events.h"

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/thread_cpu.h"

namespace kvserve::engine {

using kvcache::KvEvent;
using kvevents::BlockRemoved;
using kvevents::BlockStored;

KvEventRelay::KvEventRelay(std::unique_ptr<kvevents::Publisher> publisher,
                           int32_t block_size, std::string model_id,
                           std::string private_scopes_model)
    : publisher_(std::move(publisher)),
      block_size_(block_size),
      model_id_(std::move(model_id)),
      private_scopes_model_(std::move(private_scopes_model)) {
  announced_ns_.emplace(kvcache::NamespaceHash(model_id_, "", ""),
                        std::nullopt);
}

void KvEventRelay::NoteRequest(const std::string& cache_scope,
                               bool scope_shared,
                               const std::string& cache_salt) {
  if (!cache_salt.empty()) return;
  std::optional<std::string> lora;
  if (!cache_scope.empty() && !scope_shared) {
    if (private_scopes_model_.empty()) return;
    lora = absl::StrCat(private_scopes_model_, "@", cache_scope);
  }
  announced_ns_.try_emplace(kvcache::NamespaceHash(model_id_, cache_scope, ""),
                            std::move(lora));
}

void KvEventRelay::Attach(kvcache::KvCacheManager* kv) {
  kv_ = kv;
  kv_->set_record_events(true);
  kvevents::EventBatch batch;
  batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  batch.events.emplace_back(kvevents::AllBlocksCleared{});
  (void)publisher_->Publish(std::move(batch));
}

namespace {

// Consecutive changes of one kind and medium (and, for stores, of one chain
// and LoRA name) share an event, as vLLM's cache_full_blocks does.
void AppendRemoved(kvevents::EventBatch& b, kvevents::Medium medium,
                   uint64_t hash) {
  auto* last =
      b.events.empty() ? nullptr : std::get_if<BlockRemoved>(&b.events.back());
  if (last == nullptr || last->medium != medium) {
    b.events.emplace_back(BlockRemoved{{}, medium});
    last = &std::get<BlockRemoved>(b.events.back());
  }
  last->hashes.push_back(hash);
}

struct StoredBlock {
  kvevents::Medium medium = kvevents::Medium::kGpu;
  uint64_t hash = 0;
  std::optional<uint64_t> parent;  // none: a sequence's first block
  const std::optional<std::string>* lora_name = nullptr;
  absl::Span<const int32_t> tokens;
};

void AppendStored(kvevents::EventBatch& b, int32_t block_size,
                  const StoredBlock& block) {
  auto* last =
      b.events.empty() ? nullptr : std::get_if<BlockStored>(&b.events.back());
  if (last == nullptr || last->medium != block.medium ||
      !block.parent.has_value() || last->hashes.back() != *block.parent ||
      last->lora_name != *block.lora_name) {
    BlockStored s;
    s.parent = block.parent;
    s.block_size = block_size;
    s.medium = block.medium;
    s.lora_name = *block.lora_name;
    b.events.emplace_back(std::move(s));
    last = &std::get<BlockStored>(b.events.back());
  }
  last->hashes.push_back(block.hash);
  last->token_ids.insert(last->token_ids.end(), block.tokens.begin(),
                         block.tokens.end());
}

std::optional<uint64_t> ParentOf(kvcache::BlockHash parent) {
  if (parent == kvcache::kNoParentHash) return std::nullopt;
  return KvEventRelay::WireHash(parent);
}

}  // namespace

kvevents::EventBatch KvEventRelay::Collect(const std::vector<KvEvent>& events,
                                           const KvTiers::Changes& tiers) {
  kvevents::EventBatch batch;
  batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  int64_t stored = 0, removed = 0, unannounced = 0;
  for (const KvEvent& e : events) {
    if (e.kind == KvEvent::Kind::kRemoved) {
      if (announced_.erase(e.key) == 0) continue;
      ++removed;
      AppendRemoved(batch, kvevents::Medium::kGpu, WireHash(e.key));
      continue;
    }
    const auto ns = announced_ns_.find(e.ns);
    if (ns == announced_ns_.end()) {
      ++unannounced;
      continue;
    }
    if (!announced_.insert(e.key).second) continue;
    ++stored;
    AppendStored(batch, block_size_,
                 {kvevents::Medium::kGpu, WireHash(e.key), ParentOf(e.parent),
                  &ns->second, e.tokens});
  }
  // The host cache's and the disk tier's changes, under the same scope
  // rules.
  const std::pair<const std::vector<kvtier::TierChange>*, TierMedium> media[] =
      {{&tiers.host, {kvevents::Medium::kCpu, &announced_host_}},
       {&tiers.disk, {kvevents::Medium::kStorage, &announced_disk_}}};
  for (const auto& [changes, medium] : media) {
    for (const kvtier::TierChange& c : *changes) {
      const kvtier::BlockHeader& h = c.header;
      if (!c.stored) {
        if (medium.announced->erase(h.key) == 0) continue;
        ++removed;
        AppendRemoved(batch, medium.medium, WireHash(h.key));
        continue;
      }
      const auto ns = announced_ns_.find(h.ns);
      if (ns == announced_ns_.end()) {
        ++unannounced;
        continue;
      }
      if (!medium.announced->insert(h.key).second) continue;
      ++stored;
      AppendStored(batch, block_size_,
                   {medium.medium, WireHash(h.key), ParentOf(h.parent),
                    &ns->second, h.tokens});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.stored_blocks += stored;
  stats_.removed_blocks += removed;
  stats_.unannounced_blocks += unannounced;
  stats_.announced_blocks = static_cast<int64_t>(
      announced_.size() + announced_host_.size() + announced_disk_.size());
  return batch;
}

void KvEventRelay::Relay() {
  if (kv_ == nullptr) return;
  std::vector<KvEvent> events = kv_->TakeEvents();
  KvTiers::Changes tiers;
  if (tiers_ != nullptr) tiers = tiers_->TakeChanges();
  if (!events.empty() || !tiers.host.empty() || !tiers.disk.empty()) {
    const int64_t t0 = ThreadCpuNanos();
    kvevents::EventBatch batch = Collect(events, tiers);
    if (!batch.events.empty()) (void)publisher_->Publish(std::move(batch));
    const int64_t spent = ThreadCpuNanos() - t0;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.engine_cpu_nanos += spent;
  }
  AnswerDumps();
}

void KvEventRelay::AttachTiers(KvTiers* tiers) {
  tiers_ = tiers;
  tiers_->RecordChanges();
}

void KvEventRelay::AnswerDumps() {
  std::vector<std::shared_ptr<std::promise<ResidentBlocks>>> dumps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (dumps_.empty()) return;
    dumps.swap(dumps_);
  }
  ResidentBlocks r;
  r.block_size = block_size_;
  for (const auto& [key, ns] : kv_->FindableBlocks()) {
    if (announced_ns_.contains(ns)) {
      r.hashes.push_back(WireHash(key));
    } else {
      ++r.unannounced;
    }
  }
  for (auto& d : dumps) d->set_value(r);
}

absl::StatusOr<ResidentBlocks> KvEventRelay::ResidentHashes(
    absl::Duration timeout) {
  auto p = std::make_shared<std::promise<ResidentBlocks>>();
  std::future<ResidentBlocks> f = p->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    dumps_.push_back(std::move(p));
  }
  if (f.wait_for(absl::ToChronoMilliseconds(timeout)) !=
      std::future_status::ready) {
    return absl::DeadlineExceededError(
        "the engine did not answer the resident blocks dump in time");
  }
  return f.get();
}

KvEventStats KvEventRelay::stats() const {
  KvEventStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
  }
  s.publisher = publisher_->stats();
  return s;
}

}  // namespace kvserve::engine
