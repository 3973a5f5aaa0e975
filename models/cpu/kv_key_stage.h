// The exact keys of the int3/int2 key groups being filled (KIVI's
// residual, kvcache/kv_format.h). Those dtypes quantize a key group per
// channel across its 16 tokens, so a group that gains a row is quantized
// again as a whole, from these f32 keys rather than from its codes: each
// write leaves the pages holding a valid quantization of the rows present
// (fitted to them alone, so a partly filled group is finer than a full
// one), and the stage only keeps the next requantization exact.
//
// Entries are keyed by a group's first slot, so they follow the pages:
// a group written from its first row starts afresh; a group whose entry is
// missing or does not hold exactly the rows before a write (evicted, or
// its block refilled by a copy or a swap, Forget/Copy) is rebuilt from its
// codes first, lossy and counted (rebuilt_groups). A full group's entry
// goes; the least recently written go past `capacity` entries (a request
// that ended mid-group leaves one behind). Not thread-safe: the forward's
// thread calls it; WriteLayer parallelizes over groups.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "models/forward_batch.h"
#include "models/kv_view.h"

namespace kvserve::models::cpu {

class KvKeyStage {
 public:
  // Before a forward's first layer: the groups its tokens write.
  void Plan(const ForwardBatch& batch, const KvCacheView& kv);
  // Layer `layer`'s new key rows (token i's kv_dim keys, RoPE'd and
  // rotated, at k + i * k_stride) into the stage, and the groups they
  // touch requantized into the layer's K plane.
  void WriteLayer(int layer, const float* k, int64_t k_stride,
                  const KvCacheView& kv);
  // After the last layer: the groups' rows counted, full groups dropped.
  void Commit();

  // Block `block`'s pages were replaced wholesale (swap-in, a tier load):
  // its staged keys no longer describe them.
  void Forget(int32_t block, int32_t block_size);
  // Block `src`'s pages were copied into `dst` (copy-on-write).
  void Copy(int32_t src, int32_t dst, int32_t block_size);

  [[nodiscard]] int64_t rebuilt_groups() const { return rebuilt_; }
  [[nodiscard]] size_t num_entries() const { return entries_.size(); }
  // Bytes of staged keys held now.
  [[nodiscard]] int64_t bytes() const;

 private:
  struct Entry {
    int32_t rows = 0;         // leading rows staged
    int64_t last_use = 0;     // forward counter of the last write
    std::vector<float> keys;  // [layers][16][kv_dim]
  };
  // A run of one group's rows written by consecutive tokens.
  struct Run {
    int64_t group;  // first slot / 16
    int32_t row_begin, row_end, token_begin;
    bool rebuild;
    Entry* entry;
  };
  void EvictIdle();

  int64_t capacity_ = 64;
  int64_t forward_ = 0;
  int64_t rebuilt_ = 0;
  int64_t entry_floats_ = 0;
  absl::flat_hash_map<int64_t, Entry> entries_;
  std::vector<Run> runs_;
  std::vector<std::vector<float>> spare_;  // buffers of dropped entries
};

}  // namespace kvserve::models::cpu
