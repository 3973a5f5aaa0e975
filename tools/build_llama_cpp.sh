#!/usr/bin/env bash
# Builds llama.cpp's command-line tools (llama-server, llama-bench,
# llama-perplexity, llama-quantize, llama-cli) from the llama.cpp vendored in
# the PyPI sdist of llama-cpp-python, at the version requirements-bench.txt
# pins: the code behind the Python reference, built the way llama.cpp's users
# build it (../shared/FAIR-BENCH.md: the peer at its best), in two variants
# that tools/bench_vs_llama_server.py both runs, keeping the better per point:
#
#   default   llama.cpp's own defaults (GGML_NATIVE=ON, i.e. -march=native;
#             OpenMP on)                                  -> build-llama/bin/
#   noomp     the same without OpenMP (ggml's own thread pool, whose polling
#             and barriers behave differently on 2 shared vCPUs)
#                                                         -> build-llama-noomp/bin/
#
#   tools/build_llama_cpp.sh [default|noomp|all]          (default: default)
#
# One deviation from the defaults, where it is needed to run at all: where
# the CPU advertises AMX but the kernel does not grant its tiles (VMs: the
# Intel Xeon VM of 2026-12-05), -march=native compiles ggml's AMX matmul and
# llama-server dies with SIGSEGV in ggml_backend_amx_mul_mat on its first
# batch; there the build adds -mno-amx-{tile,int8,bf16} (llama.cpp's users on
# such a machine must do the same). KVSERVE_LLAMA_AMX=1 keeps AMX, for a
# machine whose kernel enables it (then it is the peer's best).
#
# CMake + Ninja, Release, static libraries, only the needed targets; no CURL,
# no OpenSSL, no web UI (nothing is fetched at build time). A quick no-op when
# the binaries exist and build-llama/stamp records the same version and flags.
#
# Environment:
#   KVSERVE_LLAMA_SDIST      an already downloaded llama_cpp_python-VER.tar.gz
#                            (default: pip download into build-llama/sdist/)
#   KVSERVE_LLAMA_BUILD_DIR  where to build the default variant (default:
#                            $ROOT/build-llama; noomp: the same + "-noomp")
#   KVSERVE_LLAMA_JOBS       parallel compile jobs (default: nproc)
#   KVSERVE_VENV             the project's Python environment (default .venv)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${KVSERVE_LLAMA_BUILD_DIR:-$ROOT/build-llama}"
VENV="${KVSERVE_VENV:-$ROOT/.venv}"
JOBS="${KVSERVE_LLAMA_JOBS:-$(nproc)}"
TARGETS=(llama-server llama-bench llama-perplexity llama-quantize llama-cli)
VARIANT="${1:-default}"
case "$VARIANT" in
  all)
    "$0" default && exec "$0" noomp ;;
  default) OUT="$BASE"; VARIANT_FLAGS=() ;;
  noomp) OUT="$BASE-noomp"; VARIANT_FLAGS=(-DGGML_OPENMP=OFF) ;;
  *) echo "usage: tools/build_llama_cpp.sh [default|noomp|all]" >&2; exit 2 ;;
esac

step() { echo "setup: $*"; }
fail() { echo "setup: FAILED: $*" >&2; exit 1; }

VERSION="$(sed -n 's/^llama-cpp-python==\([^[:space:]]*\).*/\1/p' \
  "$ROOT/requirements-bench.txt")"
[ -n "$VERSION" ] ||
  fail "no 'llama-cpp-python==VERSION' pin in $ROOT/requirements-bench.txt"

# llama.cpp's defaults for the CPU (GGML_NATIVE=ON); only what the build
# needs beyond them: static, Release, no network or web UI; AMX off (above).
GGML_FLAGS=("${VARIANT_FLAGS[@]}")
if [ "${KVSERVE_LLAMA_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  GGML_FLAGS+=("-DCMAKE_C_FLAGS=$NO_AMX" "-DCMAKE_CXX_FLAGS=$NO_AMX")
fi
LLAMA_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
)
STAMP_TEXT="llama-cpp-python==$VERSION
variant: $VARIANT
targets: ${TARGETS[*]}
flags: ${GGML_FLAGS[*]} ${LLAMA_FLAGS[*]}"
STAMP="$OUT/stamp"

up_to_date() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$STAMP_TEXT" ] || return 1
  local t
  for t in "${TARGETS[@]}"; do [ -x "$OUT/bin/$t" ] || return 1; done
}
if up_to_date; then
  step "llama.cpp ($VARIANT) from llama-cpp-python==$VERSION is built ($OUT/bin)"
  exit 0
fi

command -v cmake >/dev/null || fail "cmake not found (run deploy/setup.sh)"
command -v ninja >/dev/null || fail "ninja not found (run deploy/setup.sh)"

# A build of another version: start over (the CMake cache names its sources).
if [ -f "$STAMP" ] && [ "$(head -n1 "$STAMP")" != "llama-cpp-python==$VERSION" ]; then
  step "removing the llama.cpp build of $(head -n1 "$STAMP")"
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name sdist -exec rm -rf {} +
fi
mkdir -p "$OUT"
rm -f "$STAMP"

# One download serves both variants: the sdist lives beside the default's.
SDIST_DIR="$BASE/sdist"
sdist="${KVSERVE_LLAMA_SDIST:-$SDIST_DIR/llama_cpp_python-$VERSION.tar.gz}"
if [ ! -f "$sdist" ]; then
  [ -z "${KVSERVE_LLAMA_SDIST:-}" ] ||
    fail "KVSERVE_LLAMA_SDIST=$KVSERVE_LLAMA_SDIST is not a file"
  "$VENV/bin/python" -c "" 2>/dev/null ||
    fail "no Python environment at $VENV (run deploy/setup.sh)"
  step "downloading the llama-cpp-python==$VERSION sdist"
  "$VENV/bin/python" -m pip --disable-pip-version-check download -q \
    --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$SDIST_DIR" ||
    fail "pip download llama-cpp-python==$VERSION"
  [ -f "$sdist" ] || fail "pip download did not produce $sdist"
fi

src_parent="$OUT/src"
src="$src_parent/llama_cpp_python-$VERSION/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  step "unpacking vendor/llama.cpp from $(basename "$sdist")"
  rm -rf "$src_parent"
  mkdir -p "$src_parent"
  tar -xzf "$sdist" -C "$src_parent" "llama_cpp_python-$VERSION/vendor/llama.cpp" ||
    fail "unpacking $sdist (no llama_cpp_python-$VERSION/vendor/llama.cpp in it?)"
fi

step "building llama.cpp, $VARIANT (${TARGETS[*]}) from llama-cpp-python==$VERSION, $JOBS jobs"
start=$SECONDS
cmake -S "$src" -B "$OUT" -G Ninja -Wno-dev "${GGML_FLAGS[@]}" "${LLAMA_FLAGS[@]}" \
  >"$OUT/configure.log" 2>&1 ||
  fail "configuring llama.cpp (see $OUT/configure.log)"
cmake --build "$OUT" --parallel "$JOBS" --target "${TARGETS[@]}" ||
  fail "building llama.cpp (${TARGETS[*]})"
for t in "${TARGETS[@]}"; do
  [ -x "$OUT/bin/$t" ] || fail "the build did not produce $OUT/bin/$t"
done
printf '%s\n' "$STAMP_TEXT" >"$STAMP"
step "llama.cpp built in $((SECONDS - start)) s: $OUT/bin/{$(IFS=,; echo "${TARGETS[*]}")}"
