// Engine-side adapters to scheduler features that land separately (swap,
// forks, preemption modes, the extra counters). Each adapter compiles
// against a scheduler with or without the feature: a `requires` check on a
// dependent type picks the real call when the member exists and a neutral
// fallback when it does not, so the engine builds at every moment.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model_backend.h"
#include "scheduler/scheduler.h"

namespace kvserve::engine::compat {

// Executes the step's planned block moves in the contract's order: swap out,
// swap in, copy-on-write copies. Returns the blocks moved out and in.
template <typename Out>
absl::Status RunBlockMoves(const Out& out, ModelBackend& backend,
                           int64_t* swapped_out, int64_t* swapped_in) {
  auto convert = [](const auto& moves) {
    std::vector<BlockMove> v;
    v.reserve(moves.size());
    for (const auto& m : moves) {
      v.push_back({static_cast<int32_t>(m.src), static_cast<int32_t>(m.dst)});
    }
    return v;
  };
  if constexpr (requires { out.blocks_to_swap_out; }) {
    if (!out.blocks_to_swap_out.empty()) {
      auto v = convert(out.blocks_to_swap_out);
      if (absl::Status s = backend.SwapOut(v); !s.ok()) return s;
      *swapped_out += static_cast<int64_t>(v.size());
    }
  }
  if constexpr (requires { out.blocks_to_swap_in; }) {
    if (!out.blocks_to_swap_in.empty()) {
      auto v = convert(out.blocks_to_swap_in);
      if (absl::Status s = backend.SwapIn(v); !s.ok()) return s;
      *swapped_in += static_cast<int64_t>(v.size());
    }
  }
  if constexpr (requires { out.blocks_to_copy; }) {
    if (!out.blocks_to_copy.empty()) {
      auto v = convert(out.blocks_to_copy);
      if (absl::Status s = backend.CopyBlocks(v); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// Whether this scheduler can fork (Scheduler::Fork exists).
template <typename S = scheduler::Scheduler>
constexpr bool kCanFork = requires(S s, std::unique_ptr<scheduler::Request> c) {
  s.Fork(RequestId{}, std::move(c));
};

// Forks `child` (same prompt, one output token) off `parent`.
template <typename S>
absl::Status Fork(S& sched, RequestId parent,
                  std::unique_ptr<scheduler::Request> child) {
  if constexpr (requires { sched.Fork(parent, std::move(child)); }) {
    return sched.Fork(parent, std::move(child));
  } else {
    return absl::UnimplementedError("n > 1: this scheduler cannot fork");
  }
}

// Gives a fresh child request its first output token. The scheduler's
// Request spells this differently across versions; every spelling is tried.
template <typename R>
bool AppendOutputToken(R& r, int32_t token) {
  if constexpr (requires { r.set_output_token_ids({token}); }) {
    r.set_output_token_ids({token});
    return true;
  } else if constexpr (requires { r.AppendOutputToken(token); }) {
    r.AppendOutputToken(token);
    return true;
  } else if constexpr (requires { r.append_output_token(token); }) {
    r.append_output_token(token);
    return true;
  } else if constexpr (requires { r.AddOutputToken(token); }) {
    r.AddOutputToken(token);
    return true;
  } else {
    return false;
  }
}

// Scheduler counters that may not exist yet (0 when absent).
struct ExtraStats {
  int64_t preemptions_recompute = -1;  // -1: only the combined count exists
  int64_t preemptions_swap = 0;
  int64_t recomputed_tokens = -1;   // -1: use num_preempted_tokens_total
  int64_t swapped_out_blocks = -1;  // -1: count the engine's moves
  int64_t swapped_in_blocks = -1;
  int64_t swap_slots_used = 0;
  int64_t swap_slots_total = -1;    // -1: the backend's slot count
  int64_t uncacheable_tokens = -1;  // -1: the engine counts them itself
};

template <typename St>
ExtraStats ReadExtraStats(const St& s) {
  ExtraStats e;
  if constexpr (requires { s.num_preemptions_recompute_total; }) {
    e.preemptions_recompute = s.num_preemptions_recompute_total;
  }
  if constexpr (requires { s.num_preemptions_swap_total; }) {
    e.preemptions_swap = s.num_preemptions_swap_total;
  }
  if constexpr (requires { s.num_recomputed_tokens_total; }) {
    e.recomputed_tokens = s.num_recomputed_tokens_total;
  }
  if constexpr (requires { s.num_swapped_out_blocks_total; }) {
    e.swapped_out_blocks = s.num_swapped_out_blocks_total;
  }
  if constexpr (requires { s.num_swapped_in_blocks_total; }) {
    e.swapped_in_blocks = s.num_swapped_in_blocks_total;
  }
  if constexpr (requires { s.swap_slots_used; }) {
    e.swap_slots_used = s.swap_slots_used;
  }
  if constexpr (requires { s.swap_slots_total; }) {
    e.swap_slots_total = s.swap_slots_total;
  }
  if constexpr (requires { s.prefix_cache_uncacheable_tokens; }) {
    e.uncacheable_tokens = s.prefix_cache_uncacheable_tokens;
  }
  return e;
}

// Preemptions of a finished request (0 when the scheduler does not say).
template <typename F>
int32_t NumPreemptions(const F& f) {
  if constexpr (requires { f.num_preemptions; }) {
    return static_cast<int32_t>(f.num_preemptions);
  } else {
    return 0;
  }
}

// Fills the scheduler's swap / preemption / admission knobs that exist.
// InvalidArgument naming the flag for a bad preemption mode.
template <typename C>
absl::Status SetPreemptionConfig(C& sc, int32_t num_swap_slots,
                                 const std::string& mode,
                                 double recompute_seconds_per_token,
                                 double swap_seconds_per_block,
                                 int32_t thrash_limit, double high_watermark) {
  if (mode != "auto" && mode != "recompute" && mode != "swap") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--preemption-mode: must be auto, recompute, or swap, got \"", mode,
        "\""));
  }
  if constexpr (requires { sc.num_swap_slots; }) {
    sc.num_swap_slots = num_swap_slots;
  }
  if constexpr (requires { sc.preemption_mode; }) {
    using M = decltype(sc.preemption_mode);
    // NOTE: enumerators rather than scheduler::ParsePreemptionMode, which a
    // `requires` check cannot probe (a missing qualified name is an error).
    if constexpr (requires { M::kAuto; }) {
      sc.preemption_mode = mode == "swap"        ? M::kSwap
                           : mode == "recompute" ? M::kRecompute
                                                 : M::kAuto;
    }
  }
  if constexpr (requires { sc.recompute_seconds_per_token; }) {
    sc.recompute_seconds_per_token = recompute_seconds_per_token;
  }
  if constexpr (requires { sc.swap_seconds_per_block; }) {
    sc.swap_seconds_per_block = swap_seconds_per_block;
  }
  if constexpr (requires { sc.thrash_preemption_limit; }) {
    if (thrash_limit > 0) sc.thrash_preemption_limit = thrash_limit;
  }
  if constexpr (requires { sc.admission_high_watermark; }) {
    if (high_watermark > 0) sc.admission_high_watermark = high_watermark;
  }
  return absl::OkStatus();
}

}  // namespace kvserve::engine::compat
