#!/usr/bin/env bash
# Builds XGrammar's C++ core (the structured-output grammar engine) from the
# source distribution its PyPI package publishes, at the version and digest
# pinned below, into a build-time prefix:
#
#   tools/build_xgrammar.sh [gcc]
#     -> build-deps/xgrammar-VER/gcc/{include,lib/libxgrammar.a}
#
# with g++; every build links it, clang's sanitizer builds too
# (cmake/xgrammar.cmake). The source is never copied into the repository.
#
# XGrammar's own flags are overridden: no -flto=auto (a static archive of
# LTO objects links only with the same compiler version and plugin), no
# -Werror (a newer compiler's warning must not break our build); its -O3
# stays. Only the static library: no Python bindings, no tests, no cpptrace.
# Its picojson and dlpack headers (3rdparty/) come with it; it needs nothing
# else. About a minute and a half on 2 cores; a quick no-op when the
# prefix's stamp records the same version and flags.
#
# Environment:
#   KVSERVE_XGRAMMAR_SDIST   an already downloaded xgrammar-VER.tar.gz
#   KVSERVE_DEPS_DIR         where to build (default: $ROOT/build-deps)
#   KVSERVE_VENV             the project's Python environment (default .venv;
#                            its python, else python3, downloads the sdist)
#   JOBS                     parallel compile jobs (default: nproc)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The pin: a version of the PyPI package and its sdist's SHA-256.
XGRAMMAR_VERSION=0.2.9
XGRAMMAR_SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
DEPS="${KVSERVE_DEPS_DIR:-$ROOT/build-deps}"
BASE="$DEPS/xgrammar-$XGRAMMAR_VERSION"
VENV="${KVSERVE_VENV:-$ROOT/.venv}"
JOBS="${JOBS:-$(nproc)}"

step() { echo "setup: $*"; }
fail() { echo "setup: FAILED: $*" >&2; exit 1; }

TOOLCHAIN="${1:-gcc}"
case "$TOOLCHAIN" in
  gcc) CC_BIN=gcc; CXX_BIN=g++ ;;
  *) echo "usage: tools/build_xgrammar.sh [gcc]" >&2; exit 2 ;;
esac
command -v "$CXX_BIN" >/dev/null || fail "$CXX_BIN not found (deploy/setup.sh installs gcc)"

OUT="$BASE/$TOOLCHAIN"
FLAGS="-fno-lto -Wno-error"
STAMP_TEXT="xgrammar==$XGRAMMAR_VERSION sha256:$XGRAMMAR_SHA256
compiler: $("$CXX_BIN" --version | head -n1)
flags: $FLAGS"
if [ -f "$OUT/stamp" ] && [ "$(cat "$OUT/stamp")" = "$STAMP_TEXT" ] &&
   [ -f "$OUT/lib/libxgrammar.a" ]; then
  step "xgrammar $XGRAMMAR_VERSION ($TOOLCHAIN) is built ($OUT)"
  exit 0
fi

sdist="${KVSERVE_XGRAMMAR_SDIST:-$BASE/xgrammar-$XGRAMMAR_VERSION.tar.gz}"
verify() { echo "$XGRAMMAR_SHA256  $1" | sha256sum -c --status; }
if [ ! -f "$sdist" ] || ! verify "$sdist"; then
  [ -z "${KVSERVE_XGRAMMAR_SDIST:-}" ] ||
    fail "KVSERVE_XGRAMMAR_SDIST=$sdist is missing or not the pinned sdist"
  PY="$VENV/bin/python"
  "$PY" -c "" 2>/dev/null || PY=python3  # a container builder has no venv
  step "downloading the xgrammar==$XGRAMMAR_VERSION sdist from PyPI"
  mkdir -p "$BASE"
  # PyPI's simple index (PEP 691 JSON) names the file's URL; the digest
  # above is what it must hash to.
  "$PY" - "$XGRAMMAR_VERSION" "$sdist" <<'EOF' ||
import json, sys, urllib.request
version, dest = sys.argv[1], sys.argv[2]
req = urllib.request.Request(
    "https://pypi.org/simple/xgrammar/",
    headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
name = f"xgrammar-{version}.tar.gz"
url = next(f["url"] for f in files if f["filename"] == name)
with urllib.request.urlopen(url, timeout=300) as r, open(dest, "wb") as out:
    out.write(r.read())
EOF
    fail "downloading xgrammar-$XGRAMMAR_VERSION.tar.gz"
  verify "$sdist" || fail "$sdist does not hash to the pinned $XGRAMMAR_SHA256"
fi

src="$BASE/src/xgrammar-$XGRAMMAR_VERSION"
if [ ! -f "$src/CMakeLists.txt" ]; then
  step "unpacking $(basename "$sdist")"
  rm -rf "$BASE/src"
  mkdir -p "$BASE/src"
  tar -xzf "$sdist" -C "$BASE/src" || fail "unpacking $sdist"
fi

step "building xgrammar $XGRAMMAR_VERSION with $CXX_BIN, $JOBS jobs"
start=$SECONDS
build="$BASE/build-$TOOLCHAIN"
rm -rf "$build" "$OUT"
mkdir -p "$build"
# XGrammar reads its options from config.cmake in the build directory
# before its source tree's (which turns the Python bindings on).
cat >"$build/config.cmake" <<'EOF'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
EOF
# ccache keys on paths relative to $BASE, so a build in another checkout
# (CI's fresh root, whose compiler cache the main build then reads) hits.
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
export CCACHE_BASEDIR="$BASE"
CC="$CC_BIN" CXX="$CXX_BIN" cmake -S "$src" -B "$build" -G Ninja -Wno-dev \
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=$FLAGS" "${launcher[@]}" \
  -DCMAKE_INSTALL_PREFIX="$OUT" >"$build/configure.log" 2>&1 ||
  fail "configuring xgrammar (see $build/configure.log)"
cmake --build "$build" --parallel "$JOBS" >"$build/build.log" 2>&1 ||
  { tail -n 30 "$build/build.log" >&2; fail "building xgrammar (see $build/build.log)"; }
cmake --install "$build" >/dev/null || fail "installing xgrammar into $OUT"
[ -f "$OUT/lib/libxgrammar.a" ] || fail "the build did not produce $OUT/lib/libxgrammar.a"
printf '%s\n' "$STAMP_TEXT" >"$OUT/stamp"
rm -rf "$build"
step "xgrammar $XGRAMMAR_VERSION ($TOOLCHAIN) built in $((SECONDS - start)) s: $OUT"
