#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite (the README's test
# command; .ci/run calls it). Every CPU test must run: a test that skips
# (a missing model, package or tool) fails the suite, except those named by
# KVSERVE_ALLOWED_SKIPS (a regex of ctest names; none by default: the tests
# that need a GPU are labelled gpu and left out here).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
source tools/ci_budget.sh
# The C++ tests the main build makes: every one, unless the ASan stage
# follows, which builds and runs them all again; then only the kernels'
# (`models`), whose code gcc's -O2 compiles differently.
areas=all
if [ "${KVSERVE_SKIP_SANITIZERS:-0}" = 1 ]; then
  ci_budget_check main
else
  read -r -a later <<< "${SANITIZER_STAGES:-asan fuzz tidy tsan}"
  ci_budget_check main "${later[@]}"
  case " ${later[*]} " in *" asan "*) areas=models ;; esac
fi
deploy/setup.sh --test
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DKVSERVE_CPP_TEST_AREAS="$areas"
cmake --build build -j "$JOBS"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
ctest --test-dir build --output-on-failure -j "$JOBS" -LE gpu 2>&1 | tee "$log"
allowed="${KVSERVE_ALLOWED_SKIPS:-^$}"
skipped="$(sed -n 's/^ *[0-9]* - \(.*\) (Skipped)$/\1/p' "$log" |
  grep -Ev "$allowed" || true)"
if [ -n "$skipped" ]; then
  echo "tools/test.sh: these tests skipped; on a machine set up by" \
    "deploy/setup.sh --test every one must run:" >&2
  sed 's/^/  /' <<< "$skipped" >&2
  exit 1
fi
echo "==================== main suite passed in ${SECONDS} s ===================="

# CI checks beyond the main suite (each stage prints a banner and its
# elapsed time): ASan+UBSan build and C++ tests, a short run of each fuzz
# target, clang-tidy, TSan build and engine/kvtier/server tests.
# KVSERVE_SKIP_SANITIZERS=1 skips them for a quick local run.
if [ "${KVSERVE_SKIP_SANITIZERS:-0}" != 1 ]; then
  JOBS="$JOBS" tools/sanitizers.sh
fi
echo "==================== tools/test.sh passed in ${SECONDS} s ===================="
