#!/usr/bin/env bash
# The CUDA backend's device check, one script for one GPU (H200: under
# 5 minutes): builds and runs tools/bench/attention_gpu_bench.cu with nvcc
# alone (attention correctness + GB/s), then builds the CUDA targets
# (Release, sm_90 only), runs the `gpu` tests, then tools/bench/cuda_gpu_bench.cc (copy bandwidth, decode
# attention GB/s for Llama-3-8B / 70B head shapes, end-to-end decode
# tokens/s with random Llama-3-8B weights). Prints markdown tables; writes
# logs and JSON under $OUT when set (else build-device/out).
#
#   tools/device_bench.sh             build (or use .devbench/), test, bench
#   tools/device_bench.sh --quick     fewer benchmark points
#   tools/device_bench.sh --prepare   on a machine with the project's build
#       dependencies: build the same binaries (portable: no -march=native)
#       with the shared libraries they need into .devbench.tar.gz, so
#       that a device machine without abseil / gRPC can run them: carry
#       ".devbench.tar.gz" (ignored via .git/info/exclude; the carry limit
#       is 64 MiB) with the run. It is unpacked to /tmp there.
#
# On the device machine the whole command is, e.g.:
#   tools/device_bench.sh 2>&1 | tee $OUT/device_bench.log
set -uo pipefail
# No device here is a failure, not a pass: the benchmarks exit 1 and the gpu
# tests fail instead of skipping.
export KVSERVE_REQUIRE_GPU=1
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${BUILD:-$ROOT/build-device}"
PREBUILT="$ROOT/.devbench"
TARGETS=(cuda_gpu_bench cuda_kernels_gpu_test cuda_int8_kv_gpu_test
  cuda_forward_gpu_test)
MODE=run
QUICK=()
for arg in "$@"; do
  case "$arg" in
    --prepare) MODE=prepare ;;
    --quick) QUICK=(--quick) ;;
    *) echo "device_bench.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
JOBS="${JOBS:-$(nproc)}"

build() {
  local t0=$SECONDS
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKVSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DKVSERVE_NATIVE=OFF \
    -DKVSERVE_BUILD_TESTS=ON -DKVSERVE_BUILD_BENCHMARKS=ON \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed >"$1/configure.log" 2>&1 \
    || { tail -30 "$1/configure.log"; return 1; }
  cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >"$1/build.log" 2>&1 \
    || { tail -40 "$1/build.log"; return 1; }
  echo "build: $((SECONDS - t0)) s"
}

if [ "$MODE" = prepare ]; then
  mkdir -p "$PREBUILT/lib" "$BUILD"
  build "$BUILD" || exit 1
  for t in "${TARGETS[@]}"; do
    cp "$(find "$BUILD" -name "$t" -type f -perm -u+x | head -1)" "$PREBUILT/"
    strip "$PREBUILT/$t"
  done
  # Shared libraries outside glibc, libstdc++ and the CUDA driver / toolkit
  # (the device image has its own CUDA 13 runtime and cuBLAS).
  for t in "${TARGETS[@]}"; do ldd "$PREBUILT/$t"; done | awk '/=> \//{print $3}' |
    sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux|libcuda|libcudart|libcublas|libcublasLt)[.-]' |
    while read -r lib; do cp -L "$lib" "$PREBUILT/lib/"; done
  # The default model (98 MB) exceeds what a device run can carry: there the
  # end-to-end greedy test skips; the random-model forward test still runs.
  grep -qx '/.devbench/' .git/info/exclude 2>/dev/null || echo '/.devbench/' >>.git/info/exclude
  grep -qx '/.devbench.tar.gz' .git/info/exclude 2>/dev/null ||
    echo '/.devbench.tar.gz' >>.git/info/exclude
  tar -C "$PREBUILT" -czf "$ROOT/.devbench.tar.gz" .
  du -sh "$PREBUILT" "$ROOT/.devbench.tar.gz"
  echo "prepared .devbench.tar.gz: carry it with the device run"
  exit 0
fi
if [ -f "$ROOT/.devbench.tar.gz" ] && [ ! -x "$PREBUILT/cuda_gpu_bench" ]; then
  PREBUILT=/tmp/kvserve-devbench
  mkdir -p "$PREBUILT" && tar -C "$PREBUILT" -xzf "$ROOT/.devbench.tar.gz"
fi

# $OUT gets the few result files (a device run returns at most 8); build
# logs and binaries stay in $BUILD/logs.
OUTDIR="${OUT:-$BUILD/out}"
LOGDIR="$BUILD/logs"
mkdir -p "$OUTDIR" "$LOGDIR"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version \
  --format=csv 2>&1 | tee "$OUTDIR/nvidia_smi.txt"

# 1. The standalone attention check + benchmark: needs nvcc alone, so it
#    runs even where the project's dependencies are missing.
status=0
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
echo "== attention_gpu_bench (standalone)"
if "$NVCC" -O3 -std=c++17 -arch=sm_90 -I"$ROOT" \
    tools/bench/attention_gpu_bench.cu models/cuda/attention.cu \
    models/cuda/attention_mma.cu models/cuda/elementwise.cu \
    -o "$LOGDIR/attention_gpu_bench" \
    >"$LOGDIR/attention_build.log" 2>&1; then
  timeout 150 "$LOGDIR/attention_gpu_bench" | tee "$OUTDIR/attention_gpu_bench.md" ||
    status=1
else
  tail -20 "$LOGDIR/attention_build.log"; status=1
fi

# 2. The project's gpu tests and the full benchmark (end to end too).
BIN="$BUILD"
if [ -x "$PREBUILT/cuda_gpu_bench" ]; then
  echo "using prebuilt binaries from $PREBUILT"
  BIN="$PREBUILT"
  export LD_LIBRARY_PATH="$PREBUILT/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
elif ! build "$LOGDIR"; then
  echo "project build failed (missing dependencies on this image?): only the"
  echo "standalone check ran; use --prepare on a build machine and carry .devbench"
  exit 1
fi
find_bin() { find "$BIN" -name "$1" -type f -perm -u+x | head -1; }

for t in cuda_kernels_gpu_test cuda_int8_kv_gpu_test cuda_forward_gpu_test; do
  echo "== $t"
  timeout 240 "$(find_bin "$t")" --gtest_brief=1 \
    --gtest_output="json:$OUTDIR/$t.json" 2>&1 | tail -40 || status=1
done

echo "== cuda_gpu_bench"
timeout 240 "$(find_bin cuda_gpu_bench)" "${QUICK[@]}" \
  --json "$OUTDIR/cuda_bench.json" | tee "$OUTDIR/cuda_bench.md" || status=1
exit $status
