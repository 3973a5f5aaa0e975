#!/usr/bin/env bash
# CI checks beyond the main suite (tools/test.sh runs this after it):
#
#   asan  clang build with AddressSanitizer + UndefinedBehaviorSanitizer and
#         libFuzzer instrumentation (KVSERVE_FUZZ) in build-asan, with the
#         CUDA backend on the SIMT emulator (KVSERVE_CUDA_EMU); runs every
#         C++ test, the `gpu` ones included (ctest -LE python): the CUDA
#         kernels run on the CPU with every device buffer checked by ASan;
#         with them, the cases of the e2e test that serves with --device
#         cuda (label gpu, not python), side by side with the C++ tests.
#   fuzz  a short run of each libFuzzer target of that build (FUZZ_SECONDS
#         each, default 30) from its seed corpus in tests/fuzz/corpus/:
#         every seed replayed, then mutation; tools/fuzz.sh runs them long.
#   tidy  tools/clang_tidy.sh over the project's sources (.clang-tidy).
#   tsan  gcc build with ThreadSanitizer in build-tsan; runs the engine,
#         kvtier and server tests (the threaded areas; not the scheduler's
#         or the sampler's, which run on one thread, where TSan has nothing
#         to see and the sampler's statistics took 133 s).
#
#   tools/sanitizers.sh [STAGE...]     default: asan fuzz tidy tsan
#
# Sanitizer builds use -O1 and KVSERVE_SAN_DEBUG (default -g1: line tables;
# .ci/run sets -g0, as they cost a fifth of the build: CI's reports name
# functions, not lines, which a local run of the stage gives), no
# benchmarks, and assertions on. Any sanitizer report fails the stage
# (halt_on_error / abort). Runtime suppressions for third-party false
# positives: tools/sanitizers/*.supp.
# Environment: JOBS (default nproc), FUZZ_SECONDS, SANITIZER_STAGES (the
# default stage list), ASAN_BUILD_DIR (default
# build-asan: the asan stage's build, whose fuzz targets the fuzz stage runs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${JOBS:-$(nproc)}"
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
STAGES=("$@")
if [ ${#STAGES[@]} -eq 0 ]; then
  read -r -a STAGES <<< "${SANITIZER_STAGES:-asan fuzz tidy tsan}"
fi
SUPP="$ROOT/tools/sanitizers"
export ASAN_DIR="${ASAN_BUILD_DIR:-build-asan}"
SAN_G="${KVSERVE_SAN_DEBUG:--g1}"
SAN_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Debug
           -DCMAKE_CXX_FLAGS_DEBUG="-O1 $SAN_G" -DCMAKE_C_FLAGS_DEBUG="-O1 $SAN_G"
           -DKVSERVE_BUILD_BENCHMARKS=OFF -DKVSERVE_CUDA=OFF)

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$SUPP/ubsan.supp"
# ignore_noninstrumented_modules: memory interceptors (memcpy, free) called
# from inside Debian's uninstrumented gRPC, upb and abseil libraries are not
# checked: their own synchronization is invisible to TSan.
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$SUPP/tsan.supp"

banner() { echo; echo "==================== sanitizers: $* ===================="; }

stage_asan() {
  CC=clang CXX=clang++ cmake -S . -B "$ASAN_DIR" "${SAN_FLAGS[@]}" \
    -DKVSERVE_FUZZ=ON -DKVSERVE_CUDA_EMU=ON >/dev/null
  cmake --build "$ASAN_DIR" -j "$JOBS"
  # With the C++ tests: the real binary serving gRPC from the emulated GPU
  # (swap preemption through the CUDA backend), sanitized, one ctest per
  # case (py_cuda_device_e2e_test.*).
  ctest --test-dir "$ASAN_DIR" --output-on-failure -j "$JOBS" -LE python
}

# Runs every fuzz target of $ASAN_DIR for FUZZ_SECONDS, JOBS at a time;
# fails if any crashed. New inputs go to $ASAN_DIR/fuzz-corpus/ (not to the
# checked-in seeds).
stage_fuzz() {
  local logs="$ASAN_DIR/fuzz-logs"
  mkdir -p "$logs"
  local targets=()
  for f in tests/fuzz/*_fuzz.cc; do targets+=("$(basename "$f" .cc)"); done
  printf '%s\n' "${targets[@]}" | xargs -P "$JOBS" -I{} sh -c '
    mkdir -p $ASAN_DIR/fuzz-corpus/{} $ASAN_DIR/fuzz-crashes/{}
    $ASAN_DIR/tests/fuzz/{} -max_total_time='"$FUZZ_SECONDS"' -timeout=30 \
      -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix=$ASAN_DIR/fuzz-crashes/{}/ \
      $ASAN_DIR/fuzz-corpus/{} tests/fuzz/corpus/{} \
      >'"$logs"'/{}.log 2>&1 && echo "fuzz: {} ok" \
      || { echo "fuzz: {} FAILED"; tail -n 60 '"$logs"'/{}.log; exit 1; }'
  local t
  for t in "${targets[@]}"; do
    echo "fuzz: $t: $(grep -h 'stat::number_of_executed_units' \
      "$logs/$t.log" | awk '{print $2}') executions in ${FUZZ_SECONDS}s"
  done
}

stage_tidy() {
  tools/clang_tidy.sh "$ASAN_DIR"
}

stage_tsan() {
  cmake -S . -B build-tsan "${SAN_FLAGS[@]}" -DKVSERVE_SANITIZE=thread \
    >/dev/null
  # The server e2e tests spawn the kvserve binary: build it sanitized too.
  local targets=(kvserve)
  for f in tests/engine/*_test.cc tests/kvtier/*_test.cc \
           tests/server/*_test.cc; do
    case "$f" in *_gpu_test.cc|*/sampler_test.cc) continue ;; esac
    targets+=("$(basename "$f" .cc)")
  done
  cmake --build build-tsan -j "$JOBS" --target "${targets[@]}"
  # The e2e suites spawn the TSan-built kvserve; a report there kills it
  # (halt_on_error) and fails the test. Every process writes its reports
  # to build-tsan/tsan-reports/ (the spawned server's stderr is a pipe the
  # test reads), printed here; any report fails the stage.
  local reports="$ROOT/build-tsan/tsan-reports"
  rm -rf "$reports" && mkdir -p "$reports"
  local rc=0
  TSAN_OPTIONS="$TSAN_OPTIONS:log_path=$reports/tsan" \
    ctest --test-dir build-tsan --output-on-failure -j "$JOBS" \
    -L '^(engine|kvtier|server)$' -LE 'gpu|python' || rc=$?
  if compgen -G "$reports/tsan.*" >/dev/null; then
    cat "$reports"/tsan.*
    echo "tsan: reports above (build-tsan/tsan-reports/)"
    return 1
  fi
  return "$rc"
}

source tools/ci_budget.sh
for i in "${!STAGES[@]}"; do
  stage="${STAGES[$i]}"
  case "$stage" in
    asan|fuzz|tidy|tsan) ;;
    *) echo "sanitizers.sh: unknown stage '$stage'" >&2; exit 2 ;;
  esac
  ci_budget_check "${STAGES[@]:$i}"
  banner "$stage"
  start=$SECONDS
  "stage_$stage"
  echo "==================== sanitizers: $stage passed in" \
       "$((SECONDS - start)) s ===================="
done
