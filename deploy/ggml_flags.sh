#!/usr/bin/env bash
# Prints the GGML CMake flags for the llama-cpp-python build on this machine
# (deploy/setup.sh passes them as CMAKE_ARGS), one line: pip builds without
# -march=native, so the Python reference gets this CPU's extensions here.
# (The llama.cpp tools, the benchmark's peer, are built with llama.cpp's own
# defaults: tools/build_llama_cpp.sh.) AVX-512 (VNNI, BF16, VBMI) on and AMX off (ggml's
# AMX matmul segfaults where AMX tiles are not enabled), less the extensions
# this CPU lacks, which are turned off with a note on stderr: without that
# the binaries die with SIGILL in their first matmul (AMD EPYC Zen 4 machines
# have AVX-512 VNNI/BF16 but not the VEX-coded AVX-VNNI; ggml then uses the
# EVEX-coded VNNI of AVX512_VNNI + AVX512VL). /proc/cpuinfo spells VBMI
# "avx512vbmi", without the underscore of the other names.
set -euo pipefail

FLAGS=(
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
  -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
  -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF
  -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
)
set_off() {
  local opt i
  for opt in "$@"; do
    for i in "${!FLAGS[@]}"; do
      [ "${FLAGS[i]}" != "-DGGML_$opt=ON" ] || FLAGS[i]="-DGGML_$opt=OFF"
    done
  done
}
if [ -r /proc/cpuinfo ] && [ "$(uname -m)" = x86_64 ]; then
  dropped=()
  for pair in AVX:avx AVX2:avx2 FMA:fma F16C:f16c AVX512:avx512f \
              AVX512:avx512bw AVX512:avx512vl AVX512:avx512dq \
              AVX512_VBMI:avx512vbmi AVX512_VNNI:avx512_vnni \
              AVX512_BF16:avx512_bf16 AVX_VNNI:avx_vnni; do
    opt="${pair%%:*}" feat="${pair#*:}"
    grep -qw "$feat" /proc/cpuinfo && continue
    set_off "$opt"
    [ "$opt" != AVX512 ] || set_off AVX512_VBMI AVX512_VNNI AVX512_BF16
    dropped+=("$feat")
  done
  [ ${#dropped[@]} -eq 0 ] || echo "setup: note: this CPU lacks" \
    "${dropped[*]}: llama.cpp is built without them" >&2
fi
echo "${FLAGS[*]}"
