#!/usr/bin/env bash
# Fails when a tracked C++ or CUDA source differs from what clang-format
# (.clang-format at the repository root) would write. Fix with:
#   git ls-files '*.cc' '*.h' '*.cu' '*.cuh' | xargs clang-format -i
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CLANG_FORMAT="${CLANG_FORMAT:-clang-format}"
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if ! "$CLANG_FORMAT" --dry-run -Werror "${files[@]}"; then
  echo "check_format.sh: FAILED: run clang-format -i on the files above" >&2
  exit 1
fi
echo "check_format.sh: ${#files[@]} files formatted"
