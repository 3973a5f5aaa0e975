#include "engine/kv_tiers.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
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
    std::function<void(double)> observe_store) {
  const std::vector<kvtier::Piece> pieces = backend.KvBlockPieces(0);
  if (pieces.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--kv-disk-cache: the ", std::string(backend.device_name()),
        " backend's KV is not in host memory; the disk tier runs on the CPU "
        "backend"));
  }
  uint64_t payload = 0;
  for (const kvtier::Piece& p : pieces) payload += p.bytes;
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
    return absl::InvalidArgumentError(absl::StrFormat(
        "--kv-disk-cache: --block-size %d is over the tier's %d tokens",
        f.block_size, kvtier::kMaxBlockTokens));
  }
  std::unique_ptr<KvTiers> t(new KvTiers(config, backend, f));
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
  o.observe_store = std::move(observe_store);
  KV_ASSIGN_OR_RETURN(t->disk_,
                      kvtier::DiskTier::Open(o, t->salt_, fp.hash, payload));
  t->loader_ = std::make_unique<kvtier::TierLoader>(
      t->disk_.get(), t->salt_, config.load_threads, std::move(wake));
  spdlog::info(
      "kv tiers: disk {} ({:.1f} GiB); model fingerprint {} ({}, {:.1f} of "
      "{:.1f} MiB read in {:.3f} s); {} bytes per block ({}, {})",
      t->disk_->root(), o.capacity_bytes / 1073741824.0,
      kvtier::Hex128(fp.hash), fp.full ? "full" : "sampled",
      fp.hashed / 1048576.0, fp.bytes / 1048576.0, SecondsSince(t0), payload,
      f.kv_dtype, f.numerics);
  return t;
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

bool KvTiers::MaybeLoad(std::unique_ptr<scheduler::Request>& r,
                        absl::Time now) {
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
  int32_t k = static_cast<int32_t>(disk_->Probe(
      absl::MakeConstSpan(keys).subspan(m), scope_tag, kvtier::SaltTag(ns)));
  if (k <= 0) return false;
  const double recompute_block = sc.recompute_seconds_per_token * block;
  const double per_block = loader_->seconds_per_block();
  if (per_block > 0 && recompute_block > 0 && per_block > recompute_block) {
    ++stats_.skipped_slower;
    return false;
  }
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
    ++stats_.skipped_no_room;
    return false;
  }
  const RequestId id = r->id();
  std::optional<std::vector<kvcache::BlockId>> fresh =
      scheduler_->kv_cache_for_tiers().ReserveForLoad(
          id, match.blocks, k, static_cast<int32_t>(rest));
  if (!fresh.has_value()) {
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
  for (int32_t i = 0; i < k; ++i) {
    kvtier::LoadBlock b;
    b.key = keys[m + i];
    b.parent = m + i == 0 ? kvcache::kNoParentHash : keys[m + i - 1];
    b.tokens.assign(tokens.prompt.begin() + (m + i) * block,
                    tokens.prompt.begin() + (m + i + 1) * block);
    b.dst = backend_.KvBlockPieces((*fresh)[i]);
    job.blocks.push_back(std::move(b));
  }
  loading_[id] = {std::move(r), m,
                  m == 0 ? kvcache::kNoParentHash : keys[m - 1], ns};
  ++stats_.loads;
  loader_->Start(std::move(job));
  return true;
}

std::vector<KvTiers::Ready> KvTiers::TakeReady() {
  std::vector<Ready> ready;
  if (loader_ == nullptr) return ready;
  for (const kvtier::LoadResult& res : loader_->TakeDone()) {
    auto it = loading_.find(res.id);
    if (it == loading_.end()) continue;
    Loading l = std::move(it->second);
    loading_.erase(it);
    const int32_t block = scheduler_->config().block_size;
    const kvcache::TokenSequence tokens = l.request->tokens();
    const int32_t registered = scheduler_->kv_cache_for_tiers().FinishLoad(
        res.id, res.verified, l.parent, l.ns,
        tokens.prompt.subspan(static_cast<size_t>(l.first_block) * block));
    stats_.loaded_blocks += registered;
    held_[res.id] = absl::Now();
    if (res.stop == kvtier::MissReason::kDeadline) ++stats_.load_deadlines;
    ready.push_back(
        {res.id, std::move(l.request), registered * block, res.seconds});
  }
  return ready;
}

void KvTiers::Release(RequestId id) {
  if (held_.empty() || held_.erase(id) == 0) return;
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

void KvTiers::StoreNewlyCached() {
  if (disk_ == nullptr) return;
  std::vector<kvcache::CachedBlockRecord> records =
      scheduler_->kv_cache_for_tiers().TakeNewlyCached();
  const uint64_t now_ns = absl::ToUnixNanos(absl::Now());
  for (kvcache::CachedBlockRecord& rec : records) {
    auto tag = scope_tags_.find(rec.ns);
    // A namespace no longer known, or a block the disk has.
    if (tag == scope_tags_.end() || disk_->Contains(rec.key)) continue;
    kvtier::StoreItem item;
    item.header.salt = salt_;
    item.header.fingerprint = format_.fingerprint;
    item.header.key = rec.key;
    item.header.parent = rec.parent;
    item.header.ns = rec.ns;
    item.header.payload_bytes = format_.payload_bytes;
    item.header.created_unix_ns = now_ns;
    item.header.writer_pid = static_cast<uint32_t>(getpid());
    item.header.tokens = std::move(rec.tokens);
    item.scope_tag = tag->second;
    item.payload.resize(format_.payload_bytes);
    uint8_t* out = item.payload.data();
    for (const kvtier::Piece& p : backend_.KvBlockPieces(rec.block)) {
      std::memcpy(out, p.data, p.bytes);
      out += p.bytes;
    }
    (void)disk_->Store(std::move(item));
  }
}

int64_t KvTiers::Flush(absl::Time deadline) {
  return disk_ == nullptr ? 0 : disk_->Flush(deadline);
}

KvTierStats KvTiers::stats() const {
  KvTierStats s = stats_;
  if (disk_ != nullptr) s.disk = disk_->stats();
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
  if (disk_ != nullptr) {
    const kvtier::DiskTierStats d = disk_->stats();
    if (d.bytes != d.blocks * disk_->stored_block_bytes()) {
      return absl::InternalError(absl::StrCat(
          "disk tier: ", d.blocks, " blocks in ", d.bytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

KvStateTier KvTiers::StateOf() const {
  const KvTierStats s = stats();
  const kvtier::DiskTierStats& d = s.disk;
  KvStateTier t;
  t.name = "disk";
  t.path = disk_ == nullptr ? "" : disk_->root();
  t.healthy = d.writable;
  t.blocks = static_cast<int64_t>(d.blocks);
  t.bytes = static_cast<int64_t>(d.bytes);
  t.capacity_bytes = static_cast<int64_t>(d.capacity_bytes);
  t.loading_requests = s.loading_requests;
  t.hits = static_cast<int64_t>(d.hits);
  for (uint64_t m : d.misses) t.misses += static_cast<int64_t>(m);
  t.misses += s.load_deadlines;
  t.stores = static_cast<int64_t>(d.stores);
  for (uint64_t n : d.stores_dropped) {
    t.stores_dropped += static_cast<int64_t>(n);
  }
  t.evictions = static_cast<int64_t>(d.evictions);
  t.errors = static_cast<int64_t>(d.errors);
  t.loads = s.loads;
  return t;
}

}  // namespace kvserve::engine
