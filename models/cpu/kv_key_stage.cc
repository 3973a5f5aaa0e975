#include "models/cpu/kv_key_stage.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/parallel.h"
#include "kvcache/kv_format.h"
#include "models/cpu/kv_rows.h"

namespace kvserve::models::cpu {
namespace {
constexpr int kRows = kvcache::kKvKeyGroupTokens;
}  // namespace

void KvKeyStage::Plan(const ForwardBatch& batch, const KvCacheView& kv) {
  ++forward_;
  runs_.clear();
  entry_floats_ =
      static_cast<int64_t>(kv.k.size()) * kRows * kv.num_kv_heads * kv.head_dim;
  const auto& slots = batch.slot_mapping;
  for (int32_t i = 0; i < static_cast<int32_t>(slots.size()); ++i) {
    const int64_t group = slots[i] / kRows;
    const int32_t row = static_cast<int32_t>(slots[i] % kRows);
    if (!runs_.empty()) {
      Run& r = runs_.back();
      if (r.group == group && r.row_end == row &&
          r.token_begin + (r.row_end - r.row_begin) == i) {
        ++r.row_end;
        continue;
      }
    }
    runs_.push_back({group, row, row + 1, i, false, nullptr});
  }
  // Entries after the runs are known: a flat_hash_map insert may move
  // entries, so pointers are taken once nothing more is inserted.
  for (Run& r : runs_) {
    auto [it, inserted] = entries_.try_emplace(r.group);
    Entry& e = it->second;
    if (inserted || e.keys.empty()) {
      if (!spare_.empty()) {
        e.keys = std::move(spare_.back());
        spare_.pop_back();
      }
      e.keys.resize(entry_floats_);
      e.rows = 0;
    }
    if (r.row_begin == 0) {
      e.rows = 0;
    } else if (e.rows != r.row_begin) {
      r.rebuild = true;
      ++rebuilt_;
    }
  }
  for (Run& r : runs_) r.entry = &entries_.find(r.group)->second;
}

void KvKeyStage::WriteLayer(int layer, const float* k, int64_t k_stride,
                            const KvCacheView& kv) {
  const int heads = kv.num_kv_heads, dd = kv.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(heads) * dd;
  const int64_t row_bytes = kv.RowBytes(), slot_bytes = kv.SlotBytes();
  std::byte* plane = kv.k[layer];
  ParallelFor(
      static_cast<int64_t>(runs_.size()), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n) {
          const Run& r = runs_[n];
          float* keys = r.entry->keys.data() + layer * kRows * kv_dim;
          std::byte* rows = plane + r.group * kRows * slot_bytes;
          if (r.rebuild) {
            for (int j = 0; j < r.row_begin; ++j) {
              for (int h = 0; h < heads; ++h) {
                DecodeKvKeyRow(kv.dtype, rows + h * row_bytes, slot_bytes, j,
                               dd, keys + j * kv_dim + h * dd);
              }
            }
          }
          for (int32_t j = r.row_begin; j < r.row_end; ++j) {
            const int64_t token = r.token_begin + (j - r.row_begin);
            std::memcpy(keys + j * kv_dim, k + token * k_stride,
                        sizeof(float) * kv_dim);
          }
          for (int h = 0; h < heads; ++h) {
            EncodeKvKeyGroup(kv.dtype, keys + h * dd, kv_dim, r.row_end, dd,
                             rows + h * row_bytes, slot_bytes);
          }
        }
      });
}

void KvKeyStage::Commit() {
  for (const Run& r : runs_) {
    auto it = entries_.find(r.group);
    if (it == entries_.end()) continue;
    if (r.row_end == kRows) {
      spare_.push_back(std::move(it->second.keys));
      entries_.erase(it);
      continue;
    }
    it->second.rows = r.row_end;
    it->second.last_use = forward_;
  }
  capacity_ =
      std::max<int64_t>(capacity_, 2 * static_cast<int64_t>(runs_.size()));
  runs_.clear();
  EvictIdle();
  if (spare_.size() > 8) spare_.resize(8);
}

void KvKeyStage::EvictIdle() {
  if (static_cast<int64_t>(entries_.size()) <= capacity_) return;
  std::vector<std::pair<int64_t, int64_t>> by_use;  // (last_use, group)
  by_use.reserve(entries_.size());
  for (const auto& [group, e] : entries_)
    by_use.emplace_back(e.last_use, group);
  std::sort(by_use.begin(), by_use.end());
  const size_t drop = entries_.size() - static_cast<size_t>(capacity_);
  for (size_t i = 0; i < drop; ++i) {
    auto it = entries_.find(by_use[i].second);
    spare_.push_back(std::move(it->second.keys));
    entries_.erase(it);
  }
}

void KvKeyStage::Forget(int32_t block, int32_t block_size) {
  const int64_t first = int64_t{block} * block_size / kRows;
  for (int64_t g = first; g < first + block_size / kRows; ++g) {
    auto it = entries_.find(g);
    if (it == entries_.end()) continue;
    spare_.push_back(std::move(it->second.keys));
    entries_.erase(it);
  }
}

void KvKeyStage::Copy(int32_t src, int32_t dst, int32_t block_size) {
  Forget(dst, block_size);
  const int64_t per_block = block_size / kRows;
  for (int64_t j = 0; j < per_block; ++j) {
    auto it = entries_.find(int64_t{src} * per_block + j);
    if (it == entries_.end()) continue;
    Entry copy = it->second;  // a copy: the insert below may rehash
    entries_.insert_or_assign(int64_t{dst} * per_block + j, std::move(copy));
  }
}

int64_t KvKeyStage::bytes() const {
  return static_cast<int64_t>(entries_.size()) * entry_floats_ *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace kvserve::models::cpu
