// The full-precision K and V rows of the int3/int2 key groups being filled
// (KIVI's residual, kvcache/kv_format.h), one stage per KV pool.
//
// Those dtypes quantize a key group per channel across its 32 tokens, so a
// group that gains a row is quantized again as a whole, from these f32
// keys rather than from its codes: each write leaves the pages holding a
// valid quantization of the rows present (fitted to them alone), and the
// stage keeps the next requantization exact. Attention reads the groups a
// forward writes from here instead of their codes (Rows), so a token sees
// its own group, the newest keys and values, at full precision, as KIVI's
// residual does; a full group is read from its codes from the next forward
// on. A prefill chunk's groups are all written by it, so its tokens read
// the chunk in full precision (as KIVI's prefill does).
//
// Entries are keyed by a group's first slot, so they follow the pages:
// a group written from its first row starts afresh; a group whose entry is
// missing or holds fewer rows than precede a write (evicted, or its block
// refilled by a copy or a swap, Forget/Copy) is rebuilt from its codes
// first, lossy and counted (rebuilt_groups); one that holds more (rows of a
// speculative draft that was rejected) keeps its leading rows, exact. A
// full group's entry goes one forward after the forward that filled it
// (unless that one wrote it again); the least recently written go
// past `capacity` entries (a request that ended mid-group leaves one
// behind). Not thread-safe: the forward's thread calls it; WriteLayer
// parallelizes over groups and Rows may be called from any thread between
// WriteLayer and Commit.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "models/forward_batch.h"
#include "models/kv_view.h"

namespace kvserve::models::cpu {

class KvResidual {
 public:
  // Before a forward's first layer: the groups its tokens write.
  void Plan(const ForwardBatch& batch, const KvCacheView& kv);
  // Layer `layer`'s new rows (token i's kv_dim keys, RoPE'd and rotated, at
  // k + i * stride, its values at v + i * stride) into the stage, and the
  // key groups they touch requantized into the layer's K plane. The value
  // rows are the caller's to encode.
  void WriteLayer(int layer, const float* k, const float* v, int64_t stride,
                  const KvCacheView& kv);
  // After the last layer: the groups' rows counted; groups the previous
  // forward filled and this one did not write dropped.
  void Commit();

  // Between WriteLayer(layer) and Commit: layer `layer`'s rows of key group
  // `group` (first slot / 32) when this forward writes it, else null. Keys
  // of row j at [j * kv_dim, ...), values 32 * kv_dim floats after; rows
  // [0, *rows) are valid.
  [[nodiscard]] const float* Rows(int64_t group, int layer, int* rows) const;

  // Block `block`'s pages were replaced wholesale (swap-in, a tier load):
  // its staged rows no longer describe them.
  void Forget(int32_t block, int32_t block_size);
  // Block `src`'s pages were copied into `dst` (copy-on-write).
  void Copy(int32_t src, int32_t dst, int32_t block_size);

  [[nodiscard]] int64_t rebuilt_groups() const { return rebuilt_; }
  [[nodiscard]] size_t num_entries() const { return entries_.size(); }
  // Bytes of staged rows held now.
  [[nodiscard]] int64_t bytes() const;

 private:
  struct Entry {
    int32_t rows = 0;         // leading rows staged (as of the last Commit)
    int32_t live_rows = 0;    // rows valid during forward `last_use`
    int64_t last_use = 0;     // forward counter of the last write
    std::vector<float> data;  // [layers][K, V][32][kv_dim]
  };
  // A run of one group's rows written by consecutive tokens.
  struct Run {
    int64_t group;  // first slot / 32
    int32_t row_begin, row_end, token_begin;
    bool rebuild;
    Entry* entry;
  };
  void EvictIdle();
  void Drop(absl::flat_hash_map<int64_t, Entry>::iterator it);

  int64_t capacity_ = 64;
  int64_t forward_ = 0;
  int64_t rebuilt_ = 0;
  int64_t layer_floats_ = 0;  // 2 * 32 * kv_dim
  int64_t entry_floats_ = 0;
  absl::flat_hash_map<int64_t, Entry> entries_;
  std::vector<Run> runs_;
  std::vector<int64_t> filled_;            // groups the latest forward filled
  std::vector<std::vector<float>> spare_;  // buffers of dropped entries
};

}  // namespace kvserve::models::cpu
