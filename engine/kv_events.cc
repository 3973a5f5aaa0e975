#include "engine/kv_events.h"

#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

kvevents::EventBatch KvEventRelay::Collect(std::vector<KvEvent> events) {
  kvevents::EventBatch batch;
  batch.ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  int64_t stored = 0, removed = 0, unannounced = 0;
  // Consecutive changes of one kind (and, for stores, of one chain) share
  // an event, as vLLM's cache_full_blocks does.
  for (KvEvent& e : events) {
    if (e.kind == KvEvent::Kind::kRemoved) {
      if (announced_.erase(e.key) == 0) continue;
      ++removed;
      auto* last = batch.events.empty()
                       ? nullptr
                       : std::get_if<BlockRemoved>(&batch.events.back());
      if (last == nullptr) {
        batch.events.emplace_back(BlockRemoved{});
        last = &std::get<BlockRemoved>(batch.events.back());
      }
      last->hashes.push_back(WireHash(e.key));
      continue;
    }
    const auto ns = announced_ns_.find(e.ns);
    if (ns == announced_ns_.end()) {
      ++unannounced;
      continue;
    }
    if (!announced_.insert(e.key).second) continue;
    ++stored;
    auto* last = batch.events.empty()
                     ? nullptr
                     : std::get_if<BlockStored>(&batch.events.back());
    if (last == nullptr || last->hashes.back() != WireHash(e.parent) ||
        last->lora_name != ns->second) {
      BlockStored s;
      if (e.parent != kvcache::kNoParentHash) s.parent = WireHash(e.parent);
      s.block_size = block_size_;
      s.lora_name = ns->second;
      batch.events.emplace_back(std::move(s));
      last = &std::get<BlockStored>(batch.events.back());
    }
    last->hashes.push_back(WireHash(e.key));
    last->token_ids.insert(last->token_ids.end(), e.tokens.begin(),
                           e.tokens.end());
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.stored_blocks += stored;
  stats_.removed_blocks += removed;
  stats_.unannounced_blocks += unannounced;
  stats_.announced_blocks = static_cast<int64_t>(announced_.size());
  return batch;
}

void KvEventRelay::Relay() {
  if (kv_ == nullptr) return;
  std::vector<KvEvent> events = kv_->TakeEvents();
  if (!events.empty()) {
    const int64_t t0 = ThreadCpuNanos();
    kvevents::EventBatch batch = Collect(std::move(events));
    if (!batch.events.empty()) (void)publisher_->Publish(std::move(batch));
    const int64_t spent = ThreadCpuNanos() - t0;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.engine_cpu_nanos += spent;
  }
  AnswerDumps();
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
