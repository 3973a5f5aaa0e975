#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (KVSERVE_FUZZ build, clang +
# ASan/UBSan) for long runs, and merges what they find.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]   fuzz each target SECONDS (default
#                                         600) in turn; all targets if none
#   tools/fuzz.sh --merge-seeds [TARGET...]
#                                         fold the working corpus's new
#                                         coverage into the checked-in seeds
#                                         (tests/fuzz/corpus/<target>, inputs
#                                         of at most 4 KiB)
#
# Working corpora (kept between runs, not checked in) live in
# tests/fuzz/corpus-run/<target>/, crash inputs in
# tests/fuzz/corpus-run/crashes/<target>/. Reproduce one with
# `build-fuzz/tests/fuzz/<target> CRASH_FILE`. Environment: BUILD_DIR
# (default build-fuzz), JOBS (parallel fuzzing processes per target,
# default 1), FUZZ_ARGS (extra libFuzzer flags). Exits non-zero if a target
# crashed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${JOBS:-1}"
MERGE_SEEDS=0
SECONDS_EACH=600
if [ "${1:-}" = "--merge-seeds" ]; then MERGE_SEEDS=1; shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then SECONDS_EACH="$1"; shift
fi
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.cc; do TARGETS+=("$(basename "$f" .cc)"); done
fi

# Configure and build the fuzz build if needed (idempotent, incremental).
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DKVSERVE_FUZZ=ON \
    -DKVSERVE_BUILD_TESTS=OFF -DKVSERVE_BUILD_BENCHMARKS=OFF \
    -DKVSERVE_CUDA=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target "${TARGETS[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
PAR=()
if [ "$JOBS" -gt 1 ]; then PAR=(-jobs="$JOBS" -workers="$JOBS"); fi
status=0
for t in "${TARGETS[@]}"; do
  bin="$BUILD_DIR/tests/fuzz/$t"
  seeds="tests/fuzz/corpus/$t"
  work="tests/fuzz/corpus-run/$t"
  crashes="tests/fuzz/corpus-run/crashes/$t"
  mkdir -p "$work" "$crashes" "$seeds"
  if [ "$MERGE_SEEDS" = 1 ]; then
    echo "== fuzz.sh: merging $work into $seeds"
    "$bin" -merge=1 -max_len=4096 "$seeds" "$work"
    continue
  fi
  echo "== fuzz.sh: $t for ${SECONDS_EACH}s (corpus $work)"
  # shellcheck disable=SC2086
  if ! "$bin" -max_total_time="$SECONDS_EACH" -timeout=30 -rss_limit_mb=4096 \
      -print_final_stats=1 "${PAR[@]}" \
      -artifact_prefix="$crashes/" ${FUZZ_ARGS:-} "$work" "$seeds"; then
    echo "== fuzz.sh: $t FAILED; inputs in $crashes" >&2
    status=1
  fi
  # Keep the working corpus minimal: only coverage-increasing inputs.
  tmp="$(mktemp -d)"
  "$bin" -merge=1 "$tmp" "$work" >/dev/null 2>&1 && rm -rf "$work" \
    && mv "$tmp" "$work" || rm -rf "$tmp"
done
exit "$status"
