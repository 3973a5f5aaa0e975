#include "models/cpu/kv_residual.h"

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

void KvResidual::Plan(const ForwardBatch& batch, const KvCacheView& kv) {
  ++forward_;
  runs_.clear();
  layer_floats_ = int64_t{2} * kRows * kv.num_kv_heads * kv.head_dim;
  entry_floats_ = static_cast<int64_t>(kv.k.size()) * layer_floats_;
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
    if (inserted || e.data.empty()) {
      if (!spare_.empty()) {
        e.data = std::move(spare_.back());
        spare_.pop_back();
      }
      e.data.resize(entry_floats_);
      e.rows = 0;
    }
    if (r.row_begin == 0) {
      e.rows = 0;
    } else if (e.rows < r.row_begin) {  // rows [0, row_begin) missing
      r.rebuild = true;
      ++rebuilt_;
    }
    e.live_rows = r.row_end;
    e.last_use = forward_;
  }
  for (Run& r : runs_) r.entry = &entries_.find(r.group)->second;
}

void KvResidual::WriteLayer(int layer, const float* k, const float* v,
                            int64_t stride, const KvCacheView& kv) {
  const int heads = kv.num_kv_heads, dd = kv.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(heads) * dd;
  const int64_t row_bytes = kv.RowBytes(), slot_bytes = kv.SlotBytes();
  std::byte* k_plane = kv.k[layer];
  const std::byte* v_plane = kv.v[layer];
  ParallelFor(
      static_cast<int64_t>(runs_.size()), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t n = lo; n < hi; ++n) {
          const Run& r = runs_[n];
          float* keys = r.entry->data.data() + layer * layer_floats_;
          float* values = keys + kRows * kv_dim;
          const int64_t first = r.group * kRows * slot_bytes;
          std::byte* k_rows = k_plane + first;
          if (r.rebuild) {  // the rows before this write, from their codes
            for (int j = 0; j < r.row_begin; ++j) {
              for (int h = 0; h < heads; ++h) {
                DecodeKvKeyRow(kv.dtype, k_rows + h * row_bytes, slot_bytes, j,
                               dd, keys + j * kv_dim + h * dd);
                DecodeKvRow(kv.dtype,
                            v_plane + first + j * slot_bytes + h * row_bytes,
                            dd, values + j * kv_dim + h * dd);
              }
            }
          }
          for (int32_t j = r.row_begin; j < r.row_end; ++j) {
            const int64_t token = r.token_begin + (j - r.row_begin);
            std::memcpy(keys + j * kv_dim, k + token * stride,
                        sizeof(float) * kv_dim);
            std::memcpy(values + j * kv_dim, v + token * stride,
                        sizeof(float) * kv_dim);
          }
          for (int h = 0; h < heads; ++h) {
            EncodeKvKeyGroup(kv.dtype, keys + h * dd, kv_dim, r.row_end, dd,
                             k_rows + h * row_bytes, slot_bytes);
          }
        }
      });
}

const float* KvResidual::Rows(int64_t group, int layer, int* rows) const {
  auto it = entries_.find(group);
  if (it == entries_.end() || it->second.last_use != forward_) return nullptr;
  *rows = it->second.live_rows;
  return it->second.data.data() + layer * layer_floats_;
}

void KvResidual::Commit() {
  // Groups filled by the previous forward and not written again by this
  // one go now; this forward's full ones wait a forward, in case their
  // last rows were a rejected speculative draft that is written again.
  for (const int64_t group : filled_) {
    auto it = entries_.find(group);
    if (it != entries_.end() && it->second.last_use != forward_) Drop(it);
  }
  filled_.clear();
  for (const Run& r : runs_) {
    auto it = entries_.find(r.group);
    if (it == entries_.end()) continue;
    it->second.rows = r.row_end;
    if (r.row_end == kRows) filled_.push_back(r.group);
  }
  capacity_ =
      std::max<int64_t>(capacity_, 2 * static_cast<int64_t>(runs_.size()));
  runs_.clear();
  ++forward_;  // Rows answers nothing until the next Plan
  EvictIdle();
  if (spare_.size() > 8) spare_.resize(8);
}

void KvResidual::Drop(absl::flat_hash_map<int64_t, Entry>::iterator it) {
  spare_.push_back(std::move(it->second.data));
  entries_.erase(it);
}

void KvResidual::EvictIdle() {
  if (static_cast<int64_t>(entries_.size()) <= capacity_) return;
  std::vector<std::pair<int64_t, int64_t>> by_use;  // (last_use, group)
  by_use.reserve(entries_.size());
  for (const auto& [group, e] : entries_)
    by_use.emplace_back(e.last_use, group);
  std::sort(by_use.begin(), by_use.end());
  const size_t drop = entries_.size() - static_cast<size_t>(capacity_);
  for (size_t i = 0; i < drop; ++i) Drop(entries_.find(by_use[i].second));
}

void KvResidual::Forget(int32_t block, int32_t block_size) {
  const int64_t first = int64_t{block} * block_size / kRows;
  for (int64_t g = first; g < first + block_size / kRows; ++g) {
    auto it = entries_.find(g);
    if (it != entries_.end()) Drop(it);
  }
}

void KvResidual::Copy(int32_t src, int32_t dst, int32_t block_size) {
  Forget(dst, block_size);
  const int64_t per_block = block_size / kRows;
  for (int64_t j = 0; j < per_block; ++j) {
    auto it = entries_.find(int64_t{src} * per_block + j);
    if (it == entries_.end()) continue;
    Entry copy = it->second;  // a copy: the insert below may rehash
    entries_.insert_or_assign(int64_t{dst} * per_block + j, std::move(copy));
  }
}

int64_t KvResidual::bytes() const {
  return static_cast<int64_t>(entries_.size()) * entry_floats_ *
         static_cast<int64_t>(sizeof(float));
}

}  // namespace kvserve::models::cpu
