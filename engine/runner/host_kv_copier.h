// HostKvCopier: the host KV cache of a backend whose pool lives in device
// memory (CUDA), and the copies between it and the pool.
//
// The cache is pinned host memory cut into slots of one block each (the
// backend's bytes_per_block, in the layout of a swap slot); it is its own
// allocation, never the swap space's, so a full cache cannot make swapping
// fail. Which slot holds which block is the KV tiers' business
// (kvtier/host_tier.h); this seam only moves bytes.
//
// Copies run on a side stream and never wait on the host: CopyToHost
// gathers the blocks on the model stream into device staging (a kernel, so
// later steps may overwrite the blocks at once) and copies the staging to
// the slots on the side stream; CopyFromHost orders the side stream after
// the model stream's work so far and copies the slots straight into the
// blocks. A slot or block in a copy must not be touched until CopyDone
// says its ticket is done: the caller holds them until then.
//
// Engine thread only.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kvcache/block_pool.h"

namespace kvserve::engine {

class HostKvCopier {
 public:
  // Moves: pool block -> host slot (CopyToHost: src block, dst slot) or
  // host slot -> pool block (CopyFromHost: src slot, dst block).
  using Move = kvcache::BlockMove;
  struct Copy {
    int64_t ticket = 0;
    int32_t accepted = 0;  // moves [0, accepted) were started
  };

  virtual ~HostKvCopier() = default;
  [[nodiscard]] virtual int32_t num_slots() const = 0;
  [[nodiscard]] virtual int64_t slot_bytes() const = 0;
  // The slot's pinned bytes; read or written by the caller only while no
  // copy names it.
  [[nodiscard]] virtual uint8_t* slot(int32_t s) const = 0;
  // Starts copies of blocks into slots; accepts fewer than all (the rest
  // are the caller's to drop) when the staging of earlier copies is still
  // in flight. Errors are the device's (fatal to the backend).
  [[nodiscard]] virtual absl::StatusOr<Copy> CopyToHost(
      absl::Span<const Move> moves) = 0;
  // How many blocks CopyToHost would accept now (its free staging).
  [[nodiscard]] virtual int32_t store_capacity() = 0;
  // Starts copies of slots into blocks (always accepts all).
  [[nodiscard]] virtual absl::StatusOr<Copy> CopyFromHost(
      absl::Span<const Move> moves) = 0;
  // True once every copy up to `ticket` has finished.
  [[nodiscard]] virtual bool CopyDone(int64_t ticket) = 0;
  // Waits for every copy started so far (shutdown, tests).
  [[nodiscard]] virtual absl::Status WaitAll() = 0;
};

}  // namespace kvserve::engine
