#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite (the README's test
# command; .ci/run calls it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
deploy/setup.sh
JOBS="${JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS" -LE gpu
echo "==================== main suite passed in ${SECONDS} s ===================="

# CI checks beyond the main suite (each stage prints a banner and its
# elapsed time): ASan+UBSan build and C++ tests, a short run of each fuzz
# target, clang-tidy, TSan build and engine/scheduler/server tests.
# KVSERVE_SKIP_SANITIZERS=1 skips them for a quick local run.
if [ "${KVSERVE_SKIP_SANITIZERS:-0}" != 1 ]; then
  JOBS="$JOBS" tools/sanitizers.sh
fi
echo "==================== tools/test.sh passed in ${SECONDS} s ===================="
