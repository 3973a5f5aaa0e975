#include "engine/kv_tiers.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "common/thread_cpu.h"
#include "engine/tier_metrics.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_sizing.h"
#include "kvtier/block_key.h"
#include "models/loader/model_fingerprint.h"
#include "spdlog/spdlog.h"

namespace kvserve::engine {
namespace {

constexpr int64_t kMaxDefaultDiskBytes = int64_t{64} << 30;
constexpr size_t kMaxScopeTags = 1 << 16;

// 10% of the file system holding `dir` (or its nearest existing parent), at
// most 64 GiB.
int64_t DefaultDiskBytes(const std::string& dir) {
  std::filesystem::path p = dir;
  std::error_code ec;
  while (!p.empty() && !std::filesystem::exists(p, ec)) p = p.parent_path();
  struct statvfs st;
  if (statvfs(p.empty() ? "." : p.c_str(), &st) != 0) return 1 << 30;
  const int64_t total =
      static_cast<int64_t>(st.f_blocks) * static_cast<int64_t>(st.f_frsize);
  return std::min(total / 10, kMaxDefaultDiskBytes);
}

// What the config's RoPE and context make of the weights.
std::string ConfigSalt(const models::ModelConfig& c) {
  return absl::StrFormat(
      "max_position=%d rope_theta=%.9g scaling=%d/%.9g/%.9g/%.9g/%d",
      c.max_position, c.rope_theta, static_cast<int>(c.rope_scaling.type),
      c.rope_scaling.factor, c.rope_scaling.low_freq_factor,
      c.rope_scaling.high_freq_factor, c.rope_scaling.original_max_position);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTiers>> KvTiers::Create(
    const KvTierConfig& config, const LoadedModel& model,
    const ModelBackend& backend, std::function<void()> wake,
    TierMetrics* metrics) {
  const char* flag = !config.disk_dir.empty()     ? "--kv-disk-cache"
                     : !config.remote_url.empty() ? "--kv-remote-cache"
                                                  : "--kv-host-cache-bytes";
  const std::vector<kvtier::Piece> pieces = backend.KvBlockPieces(0);
  HostKvCopier* copier = backend.host_kv_copier();
  uint64_t payload = 0;
  if (!pieces.empty()) {
    if (config.host_bytes > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--kv-host-cache-bytes: the ", std::string(backend.device_name()),
          " backend's KV pool is in host memory already (size it with "
          "--kv-cache-bytes); the host cache is for --device cuda"));
    }
    for (const kvtier::Piece& p : pieces) payload += p.bytes;
  } else if (copier != nullptr) {
    payload = static_cast<uint64_t>(copier->slot_bytes());
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, ": the ", std::string(backend.device_name()),
        " backend's KV is in device memory: its tiers stage through a host "
        "cache; set --kv-host-cache-bytes"));
  }
  const absl::Time t0 = absl::Now();
  KV_ASSIGN_OR_RETURN(
      models::ModelFingerprint fp,
      models::FingerprintModel(model.path, ConfigSalt(model.config)));
  const models::ModelConfig& c = model.config;
  const kvcache::KvRotation rot =
      kvcache::KvRotationFor(backend.kv_dtype(), c.head_dim);
  kvtier::BlockFormat f;
  f.fingerprint = fp.hash;
  f.kv_dtype = std::string(kvcache::KvDtypeName(backend.kv_dtype()));
  f.rotation_k = rot.k;
  f.rotation_v = rot.v;
  f.block_size = backend.block_size();
  f.num_layers = c.num_layers;
  f.num_kv_heads = c.num_kv_heads;
  f.head_dim = c.head_dim;
  f.numerics = backend.kv_numerics_version();
  f.layout = backend.kv_layout_version();
  f.payload_bytes = payload;
  if (f.block_size > kvtier::kMaxBlockTokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: --block-size %d is over the tier's %d tokens",
                        flag, f.block_size, kvtier::kMaxBlockTokens));
  }
  std::shared_ptr<const kvtier::BlockCipher> cipher;
  if (!config.encryption_key_file.empty()) {
    KV_ASSIGN_OR_RETURN(
        cipher, kvtier::BlockCipher::FromKeyFile(config.encryption_key_file));
    f.encryption = cipher->id();
  }
  std::unique_ptr<KvTiers> t(new KvTiers(config, backend, f));
  t->cipher_ = std::move(cipher);
  if (copier != nullptr) {
    t->copier_ = copier;
    t->host_ = std::make_unique<kvtier::HostTier>(copier->num_slots(), payload);
  }
  if (!config.disk_dir.empty())
    KV_RETURN_IF_ERROR(t->OpenDisk(config, metrics));
  if (!config.remote_url.empty()) {
    KV_RETURN_IF_ERROR(t->OpenRemote(config, metrics));
  }
  t->wake_ = wake;
  t->loader_ = std::make_unique<kvtier::TierLoader>(
      t->disk_.get(), t->remote_.get(), t->salt_, config.load_threads,
      std::move(wake));
  spdlog::info(
      "kv tiers: host {}, disk {}, remote {}, blocks {}; model fingerprint {} "
      "({}, {:.1f} of {:.1f} MiB read in {:.3f} s); {} bytes per block ({}, "
      "{})",
      t->host_ ? absl::StrCat(copier->num_slots(), " slots") : "off",
      t->disk_ ? t->disk_->root() : "off",
      t->remote_ ? t->remote_->Describe() : "off",
      t->cipher_ ? "sealed (" + t->cipher_->id() + ")" : "in the clear",
      kvtier::Hex128(fp.hash), fp.full ? "full" : "sampled",
      fp.hashed / 1048576.0, fp.bytes / 1048576.0, SecondsSince(t0), payload,
      f.kv_dtype, f.numerics);
  return t;
}

absl::Status KvTiers::OpenDisk(const KvTierConfig& config,
                               TierMetrics* metrics) {
  const uint64_t payload = format_.payload_bytes;
  kvtier::DiskTierOptions o;
  o.dir = config.disk_dir;
  o.capacity_bytes = static_cast<uint64_t>(
      config.disk_bytes > 0 ? config.disk_bytes
                            : DefaultDiskBytes(config.disk_dir));
  // A long prompt's blocks arrive in one step: room for 256 MiB of them.
  o.max_queued_blocks = static_cast<int>(std::max<uint64_t>(
      64, (uint64_t{256} << 20) / std::max<uint64_t>(payload, 1)));
  o.inject_write_errno = config.inject_write_errno;
  o.inject_read_errno = config.inject_read_errno;
  o.cipher = cipher_;
  if (metrics != nullptr) {
    o.observe_store = [metrics](double s) {
      metrics->ObserveStore(TierMetrics::kDisk, s);
    };
  }
  KV_ASSIGN_OR_RETURN(
      disk_, kvtier::DiskTier::Open(o, salt_, format_.fingerprint, payload));
  spdlog::info("kv disk tier: {} ({:.1f} GiB)", disk_->root(),
               o.capacity_bytes / 1073741824.0);
  return absl::OkStatus();
}

absl::Status KvTiers::OpenRemote(const KvTierConfig& config,
                                 TierMetrics* metrics) {
  kvtier::RemoteTierOptions o;
  KV_ASSIGN_OR_RETURN(o.target, kvtier::ParseRedisUrl(config.remote_url));
  o.auth = {config.remote_user, config.remote_password};
  o.timeout = config.remote_timeout;
  o.ttl_seconds = config.remote_ttl_seconds;
  o.cipher = cipher_;
  const uint64_t payload = format_.payload_bytes;
  o.max_queued_blocks = static_cast<int>(std::max<uint64_t>(
      64, (uint64_t{256} << 20) / std::max<uint64_t>(payload, 1)));
  if (metrics != nullptr) {
    o.observe_store = [metrics](double s) {
      metrics->ObserveStore(TierMetrics::kRemote, s);
    };
  }
  KV_ASSIGN_OR_RETURN(remote_, kvtier::RemoteTier::Open(o, salt_, payload));
  spdlog::info("kv remote tier: {} ({})", remote_->Describe(),
               remote_->healthy() ? "reachable" : "unreachable now, retried");
  return absl::OkStatus();
}

KvTiers::KvTiers(const KvTierConfig& config, const ModelBackend& backend,
                 kvtier::BlockFormat format)
    : config_(config),
      backend_(backend),
      format_(std::move(format)),
      salt_(kvtier::ModelKvSalt(format_)),
      model_id_(kvtier::ModelIdFor(salt_)) {}

KvTiers::~KvTiers() { Stop(); }

void KvTiers::Stop() { loader_.reset(); }

void KvTiers::Attach(scheduler::Scheduler* scheduler) {
  scheduler_ = scheduler;
  scheduler_->kv_cache_for_tiers().set_record_newly_cached(true);
}

int32_t KvTiers::PlanLoad(absl::Span<const kvcache::BlockHash> keys,
                          uint64_t scope_tag, kvcache::BlockHash ns,
                          int32_t* disk_blocks) {
  *disk_blocks = disk_ == nullptr ? 0
                                  : static_cast<int32_t>(disk_->Probe(
                                        keys, scope_tag, kvtier::SaltTag(ns)));
  // The remote is asked for the rest by the load itself (its GETs).
  const auto n = static_cast<int32_t>(keys.size());
  if (remote_ != nullptr && remote_->healthy()) return n;
  return *disk_blocks;
}

bool KvTiers::MaybeLoad(std::unique_ptr<scheduler::Request>& r,
                        absl::Time now) {
  ScopedThreadCpu cpu(&stats_.engine_cpu_nanos);
  const scheduler::SchedulerConfig& sc = scheduler_->config();
  if (loader_ == nullptr || !sc.enable_prefix_caching) return false;
  const kvcache::BlockHash ns =
      kvcache::NamespaceHash(model_id_, r->cache_scope(), r->cache_salt());
  if (scope_tags_.size() >= kMaxScopeTags) scope_tags_.clear();
  const uint64_t scope_tag = kvtier::ScopeTag(model_id_, r->cache_scope());
  scope_tags_[ns] = scope_tag;
  const kvcache::TokenSequence tokens = r->tokens();
  const int32_t block = sc.block_size;
  // Every full block of the prompt: the one holding its last token too,
  // which the scheduler then takes as a cached tail (all but that token).
  const int32_t full_blocks = tokens.size() / block;
  const kvcache::KvCacheManager& kv = scheduler_->kv_cache();
  const kvcache::PrefixMatch match =
      kv.FindCachedPrefix(tokens, ns, /*allow_tail=*/false);
  const auto m = static_cast<int32_t>(match.blocks.size());
  if (m >= full_blocks) return false;
  const std::vector<kvcache::BlockHash> keys =
      kvcache::ChainBlockHashes(tokens.prompt, ns, block, full_blocks);
  const kvcache::BlockHash parent =
      m == 0 ? kvcache::kNoParentHash : keys[m - 1];
  // The host cache's run first (in memory, verified against the tokens),
  // then the disk's and the remote's.
  std::vector<int32_t> host_run;
  if (host_ != nullptr) {
    host_run = host_->Probe(absl::MakeConstSpan(keys).subspan(m), parent, ns,
                            tokens.prompt.subspan(m * block), block);
  }
  auto unpin_from = [&](size_t from) {
    for (size_t i = from; i < host_run.size(); ++i) host_->Unpin(host_run[i]);
    host_run.resize(std::min(from, host_run.size()));
  };
  const auto kh = static_cast<int32_t>(host_run.size());
  int32_t kd = 0;
  int32_t k = kh;
  const double recompute_block = sc.recompute_seconds_per_token * block;
  const double per_block = loader_->seconds_per_block();
  if (m + kh < full_blocks) {
    const int32_t below =
        PlanLoad(absl::MakeConstSpan(keys).subspan(m + kh), scope_tag, ns, &kd);
    if (below > 0 && per_block > 0 && recompute_block > 0 &&
        per_block > recompute_block) {
      ++stats_.skipped_slower;
      kd = 0;
    } else {
      k += below;
    }
  }
  if (k <= 0) return false;
  // Leave room for the rest of the prompt and the watermark.
  int32_t evictable = 0;
  for (const kvcache::BlockId b : match.blocks) {
    if (kv.pool().ref_count(b) == 0) ++evictable;
  }
  const int64_t rest = kvcache::BlocksForTokens(tokens.size() + 1, block) - m -
                       k + sc.watermark_blocks();
  const int64_t room = int64_t{kv.num_free_blocks()} - evictable - rest;
  k = static_cast<int32_t>(std::min<int64_t>(k, room));
  if (k <= 0) {
    unpin_from(0);
    ++stats_.skipped_no_room;
    return false;
  }
  unpin_from(k);
  kd = std::min(kd, k - static_cast<int32_t>(host_run.size()));
  const RequestId id = r->id();
  std::optional<std::vector<kvcache::BlockId>> fresh =
      scheduler_->kv_cache_for_tiers().ReserveForLoad(
          id, match.blocks, k, static_cast<int32_t>(rest));
  if (!fresh.has_value()) {
    unpin_from(0);
    ++stats_.skipped_no_room;
    return false;
  }
  kvtier::LoadJob job;
  job.id = id;
  job.ns = ns;
  job.scope_tag = scope_tag;
  const double predicted = recompute_block * k;
  job.deadline =
      now + std::max(config_.min_load_deadline,
                     absl::Seconds(config_.load_deadline_factor * predicted));
  Loading l;
  l.first_block = m;
  l.parent = parent;
  l.ns = ns;
  l.disk_blocks = kd;
  l.scope_tag = scope_tag;
  l.host_slots = std::move(host_run);
  l.start = now;
  const auto first = static_cast<int32_t>(l.host_slots.size());
  for (int32_t i = first; i < k; ++i) {
    kvtier::LoadBlock b;
    b.key = keys[m + i];
    b.parent = m + i == 0 ? kvcache::kNoParentHash : keys[m + i - 1];
    b.tokens.assign(tokens.prompt.begin() + (m + i) * block,
                    tokens.prompt.begin() + (m + i + 1) * block);
    if (copier_ == nullptr) b.dst = backend_.KvBlockPieces((*fresh)[i]);
    b.remote = i - first >= kd;
    if (copier_ != nullptr || (disk_ != nullptr && remote_ != nullptr)) {
      l.keys.push_back(b.key);
      l.fresh.push_back((*fresh)[i]);
    }
    job.blocks.push_back(std::move(b));
  }
  if (copier_ != nullptr && !StartDeviceLoad(l, job, *fresh)) {
    scheduler_->kv_cache_for_tiers().ReleaseLoad(id);
    ++stats_.skipped_no_room;
    return false;
  }
  l.request = std::move(r);
  l.loader_running = !job.blocks.empty();
  loading_[id] = std::move(l);
  ++stats_.loads;
  if (!job.blocks.empty()) loader_->Start(std::move(job));
  return true;
}

std::vector<KvTiers::Ready> KvTiers::TakeReady() {
  ScopedThreadCpu cpu(&stats_.engine_cpu_nanos);
  std::vector<Ready> ready;
  if (loader_ == nullptr) return ready;
  if (copier_ != nullptr) PollHostStores();
  ApplyEnginePurges();
  for (const kvtier::LoadResult& res : loader_->TakeDone()) {
    auto it = loading_.find(res.id);
    if (it == loading_.end()) continue;
    Loading& l = it->second;
    if (res.stop == kvtier::MissReason::kDeadline) {
      ++(res.verified >= l.disk_blocks ? stats_.remote_load_deadlines
                                       : stats_.load_deadlines);
    }
    if (copier_ != nullptr) {
      OnDeviceLoaded(l, res);
      continue;
    }
    Loading done = std::move(l);
    loading_.erase(it);
    ready.push_back(Finish(res.id, done, res.verified, res.seconds));
  }
  if (copier_ != nullptr) TakeDeviceReady(&ready);
  return ready;
}

KvTiers::Ready KvTiers::Finish(RequestId id, Loading& l, int32_t verified,
                               double seconds) {
  const int32_t block = scheduler_->config().block_size;
  const kvcache::TokenSequence tokens = l.request->tokens();
  const int32_t registered = scheduler_->kv_cache_for_tiers().FinishLoad(
      id, verified, l.parent, l.ns,
      tokens.prompt.subspan(static_cast<size_t>(l.first_block) * block));
  stats_.loaded_blocks += registered;
  held_[id] = absl::Now();
  const auto kh =
      std::min(registered, static_cast<int32_t>(l.host_slots.size()));
  const int32_t from_disk = std::min(registered - kh, l.disk_blocks);
  // What the remote brought in goes to the disk too (on a device, the host
  // cache hands it down when it commits).
  for (int32_t j = from_disk; copier_ == nullptr && j < registered &&
                              j < static_cast<int32_t>(l.keys.size());
       ++j) {
    const auto begin = tokens.prompt.begin() + (l.first_block + j) * block;
    (void)disk_->Store(ItemOf(PayloadOfBlock(l.fresh[j]), l.keys[j],
                              j == 0 ? l.parent : l.keys[j - 1], l.ns,
                              l.scope_tag,
                              std::vector<int32_t>(begin, begin + block)));
  }
  return {id,
          std::move(l.request),
          kh * block,
          from_disk * block,
          (registered - kh - from_disk) * block,
          seconds};
}

void KvTiers::Release(RequestId id) {
  if (held_.empty() || held_.erase(id) == 0) return;
  ScopedThreadCpu cpu(&stats_.engine_cpu_nanos);
  scheduler_->kv_cache_for_tiers().ReleaseLoad(id);
}

void KvTiers::ReleaseStale(absl::Time now) {
  constexpr absl::Duration kMaxHold = absl::Seconds(2);
  std::vector<RequestId> stale;
  for (const auto& [id, since] : held_) {
    if (now - since > kMaxHold) stale.push_back(id);
  }
  for (RequestId id : stale) Release(id);
}

KvTiers::Payload KvTiers::PayloadOfBlock(kvcache::BlockId block) const {
  auto copy = std::make_shared<std::vector<uint8_t>>(format_.payload_bytes);
  uint8_t* out = copy->data();
  for (const kvtier::Piece& p : backend_.KvBlockPieces(block)) {
    std::memcpy(out, p.data, p.bytes);
    out += p.bytes;
  }
  const absl::Span<const uint8_t> bytes = absl::MakeConstSpan(*copy);
  return {bytes, std::move(copy)};
}

kvtier::StoreItem KvTiers::ItemOf(Payload payload, kvcache::BlockHash key,
                                  kvcache::BlockHash parent,
                                  kvcache::BlockHash ns, uint64_t scope_tag,
                                  std::vector<int32_t> tokens) const {
  kvtier::StoreItem item;
  item.header.salt = salt_;
  item.header.fingerprint = format_.fingerprint;
  item.header.key = key;
  item.header.parent = parent;
  item.header.ns = ns;
  item.header.payload_bytes = format_.payload_bytes;
  item.header.created_unix_ns = absl::ToUnixNanos(absl::Now());
  item.header.writer_pid = static_cast<uint32_t>(getpid());
  item.header.tokens = std::move(tokens);
  item.scope_tag = scope_tag;
  item.payload = payload.bytes;
  item.owner = std::move(payload.owner);
  return item;
}

void KvTiers::StoreNewlyCached() {
  ScopedThreadCpu cpu(&stats_.engine_cpu_nanos);
  std::vector<kvcache::CachedBlockRecord> records =
      scheduler_->kv_cache_for_tiers().TakeNewlyCached();
  if (copier_ != nullptr) {
    StoreToHost(std::move(records));
    return;
  }
  for (kvcache::CachedBlockRecord& rec : records) {
    auto tag = scope_tags_.find(rec.ns);
    if (tag == scope_tags_.end()) continue;  // a namespace no longer known
    if ((disk_ == nullptr || disk_->Contains(rec.key)) && remote_ == nullptr) {
      continue;
    }
    StoreBelow(ItemOf(PayloadOfBlock(rec.block), rec.key, rec.parent, rec.ns,
                      tag->second, std::move(rec.tokens)));
  }
}

void KvTiers::StoreBelow(kvtier::StoreItem item) {
  const bool to_disk = disk_ != nullptr && !disk_->Contains(item.header.key);
  // One copy of the bytes, shared by the tiers that write it.
  if (remote_ != nullptr && to_disk) {
    (void)remote_->Store(item);
    (void)disk_->Store(std::move(item));
  } else if (remote_ != nullptr) {
    (void)remote_->Store(std::move(item));
  } else if (to_disk) {
    (void)disk_->Store(std::move(item));
  }
}

absl::StatusOr<KvTierPurge> KvTiers::Purge(
    const std::optional<std::string>& cache_scope,
    const std::optional<std::string>& cache_salt) const {
  std::optional<uint64_t> scope_tag, salt_tag;
  if (cache_scope.has_value()) {
    scope_tag = kvtier::ScopeTag(model_id_, *cache_scope);
    if (cache_salt.has_value()) {
      salt_tag = kvtier::SaltTag(
          kvcache::NamespaceHash(model_id_, *cache_scope, *cache_salt));
    }
  }
  KvTierPurge p;
  {
    auto purge = std::make_shared<EnginePurge>();
    purge->scope_tag = scope_tag;
    purge->salt_tag = salt_tag;
    std::future<std::pair<int64_t, int64_t>> blocks =
        purge->blocks.get_future();
    {
      std::lock_guard<std::mutex> lock(purge_mu_);
      engine_purges_.push_back(purge);
    }
    wake_();
    if (blocks.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      return absl::UnavailableError(
          "the engine did not purge its KV pool within 5 s; try again");
    }
    std::tie(p.device_blocks, p.host_blocks) = blocks.get();
  }
  if (disk_ != nullptr) p.disk_blocks = disk_->Purge(scope_tag, salt_tag);
  if (remote_ != nullptr) {
    KV_ASSIGN_OR_RETURN(p.remote_blocks, remote_->Purge(scope_tag, salt_tag));
  }
  return p;
}

void KvTiers::ApplyEnginePurges() {
  std::vector<std::shared_ptr<EnginePurge>> purges;
  {
    std::lock_guard<std::mutex> lock(purge_mu_);
    purges.swap(engine_purges_);
  }
  for (const std::shared_ptr<EnginePurge>& p : purges) {
    // The pool knows namespaces only: their scope tags are the ones seen.
    auto match = [&](kvcache::BlockHash ns) {
      if (p->salt_tag.has_value() && kvtier::SaltTag(ns) != *p->salt_tag) {
        return false;
      }
      if (!p->scope_tag.has_value()) return true;
      auto it = scope_tags_.find(ns);
      return it != scope_tags_.end() && it->second == *p->scope_tag;
    };
    const int64_t pool = scheduler_->kv_cache_for_tiers().PurgeCached(match);
    const int64_t host =
        host_ == nullptr ? 0 : host_->Purge(p->scope_tag, p->salt_tag);
    p->blocks.set_value({pool, host});
  }
}

int64_t KvTiers::Flush(absl::Time deadline) {
  while (pending_host_stores_.load() > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));  // the engine thread polls them
  }
  int64_t dropped = 0;
  if (disk_ != nullptr) dropped += disk_->Flush(deadline);
  if (remote_ != nullptr) dropped += remote_->Flush(deadline);
  return dropped;
}

void KvTiers::RecordChanges() {
  if (host_ != nullptr) host_->RecordChanges();
  if (disk_ != nullptr) disk_->RecordChanges();
}

KvTiers::Changes KvTiers::TakeChanges() {
  Changes c;
  if (host_ != nullptr) c.host = host_->TakeChanges();
  if (disk_ != nullptr) c.disk = disk_->TakeChanges();
  return c;
}

KvTierStats KvTiers::stats() const {
  KvTierStats s = stats_;
  s.has_host = host_ != nullptr;
  if (host_ != nullptr) s.host = host_->stats();
  s.has_disk = disk_ != nullptr;
  s.has_remote = remote_ != nullptr;
  if (disk_ != nullptr) s.disk = disk_->stats();
  if (remote_ != nullptr) s.remote = remote_->stats();
  s.loading_requests = static_cast<int64_t>(loading_.size());
  if (loader_ != nullptr) {
    s.load_seconds_per_block = loader_->seconds_per_block();
  }
  return s;
}

absl::Status KvTiers::CheckInvariants() const {
  const int32_t loads = scheduler_->kv_cache().num_loads();
  if (loads != static_cast<int32_t>(loading_.size() + held_.size())) {
    return absl::InternalError(
        absl::StrCat(loading_.size(), " requests loading and ", held_.size(),
                     " loaded, but ", loads, " loads holding pool blocks"));
  }
  if (host_ != nullptr) KV_RETURN_IF_ERROR(host_->CheckInvariants());
  if (disk_ != nullptr) {
    const kvtier::DiskTierStats d = disk_->stats();
    if (d.bytes != d.blocks * disk_->stored_block_bytes()) {
      return absl::InternalError(absl::StrCat(
          "disk tier: ", d.blocks, " blocks in ", d.bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

namespace {

KvStateTier StateOfTier(std::string name, std::string path,
                        const kvtier::TierStats& d, int64_t deadlines) {
  KvStateTier t;
  t.name = std::move(name);
  t.path = std::move(path);
  t.healthy = d.healthy;
  t.blocks = static_cast<int64_t>(d.blocks);
  t.bytes = static_cast<int64_t>(d.bytes);
  t.capacity_bytes = static_cast<int64_t>(d.capacity_bytes);
  t.hits = static_cast<int64_t>(d.hits);
  for (uint64_t m : d.misses) t.misses += static_cast<int64_t>(m);
  t.misses += deadlines;
  t.stores = static_cast<int64_t>(d.stores);
  for (uint64_t n : d.stores_dropped) {
    t.stores_dropped += static_cast<int64_t>(n);
  }
  t.evictions = static_cast<int64_t>(d.evictions);
  t.errors = static_cast<int64_t>(d.errors);
  return t;
}

}  // namespace

std::vector<KvStateTier> KvTiers::StateOf() const {
  const KvTierStats s = stats();
  std::vector<KvStateTier> out;
  if (host_ != nullptr) {
    out.push_back(StateOfTier("host", "pinned memory", s.host, 0));
  }
  if (disk_ != nullptr) {
    out.push_back(StateOfTier("disk", disk_->root(), s.disk, s.load_deadlines));
  }
  if (remote_ != nullptr) {
    out.push_back(StateOfTier("remote", remote_->Describe(), s.remote,
                              s.remote_load_deadlines));
  }
  // Loads span the tiers: the first tier carries them.
  if (!out.empty()) {
    out[0].loading_requests = s.loading_requests;
    out[0].loads = s.loads;
  }
  return out;
}

}  // namespace kvserve::engine
