#!/usr/bin/env bash
# Runs clang-tidy (configuration: .clang-tidy at the repository root) over
# the project's own .cc files listed in BUILD_DIR/compile_commands.json
# (common, kvcache, models, scheduler, engine, server, cli, tools; not tests,
# generated proto code or third-party code). Every enabled check is an error
# (WarningsAsErrors), so the script fails on any finding.
#
#   tools/clang_tidy.sh [BUILD_DIR] [FILE...]    default BUILD_DIR: build
#
# BUILD_DIR must be configured and its generated headers built (the proto
# library). Environment: JOBS (parallel clang-tidy processes, default nproc),
# CLANG_TIDY (binary, default .venv/bin/clang-tidy: requirements-test.txt's
# pin, which deploy/setup.sh --test installs; it matches the project's own
# code only, not the system headers, where Debian's clang-tidy 14 spent 2.5x
# the CPU).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${1:-build}"
shift || true
JOBS="${JOBS:-$(nproc)}"
CLANG_TIDY="${CLANG_TIDY:-$ROOT/.venv/bin/clang-tidy}"
if [ ! -x "$CLANG_TIDY" ]; then
  echo "clang_tidy.sh: $CLANG_TIDY missing (deploy/setup.sh --test installs it)" >&2
  exit 2
fi
DB="$BUILD_DIR/compile_commands.json"
if [ ! -f "$DB" ]; then
  echo "clang_tidy.sh: $DB missing; configure $BUILD_DIR first" >&2
  exit 2
fi
# Generated headers (kvserve.pb.h) must exist for the server sources.
if [ ! -f "$BUILD_DIR/proto/gen/kvserve/v1/kvserve.pb.h" ]; then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target kvserve_proto >/dev/null
fi

if [ $# -gt 0 ]; then
  files=("$@")
else
  mapfile -t files < <(python3 - "$DB" "$ROOT" <<'PY'
import json, os, re, sys
db, root = sys.argv[1], os.path.realpath(sys.argv[2])
keep = re.compile(r"^(common|kvcache|kvtier|kvevents|models|scheduler|engine|server|cli|tools)/.*\.cc$")
seen = set()
for entry in json.load(open(db)):
    path = os.path.realpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if keep.match(rel) and rel not in seen:
        seen.add(rel)
        print(rel)
PY
  )
fi
# Sanitizer flags off: with them, abseil includes <sanitizer/*.h>, which only
# the compiler's own resource directory has, not clang-tidy's.
NO_SAN="--extra-arg=-fno-sanitize=all"
echo "clang_tidy.sh: ${#files[@]} files, $JOBS jobs ($("$CLANG_TIDY" --version | grep -o 'version [0-9.]*'))"
# One clang-tidy per file; a file's output is printed whole when it fails.
if ! printf '%s\n' "${files[@]}" | xargs -P "$JOBS" -I{} sh -c \
    "out=\$($CLANG_TIDY -p '$BUILD_DIR' --quiet $NO_SAN {} 2>&1) || \
     { printf '%s\n' \"\$out\" | grep -v -E '^[0-9]+ warnings? generated\.|^Suppressed [0-9]+ warnings|^Use -header-filter|^Use -system-headers'; exit 1; }" \
    ; then
  echo "clang_tidy.sh: FAILED (fix the findings above, or narrow .clang-tidy" \
       "with a comment saying why)" >&2
  exit 1
fi
echo "clang_tidy.sh: clean"
