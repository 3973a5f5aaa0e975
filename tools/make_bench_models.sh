#!/usr/bin/env bash
# Builds the model files of the benchmark against llama.cpp
# (tools/bench_vs_llama_server.py, ../shared/FAIR-BENCH.md "What users run"):
# random-weight GGUFs of real Llama shapes (tools/make_synthetic_gguf.py: the
# default model's tokenizer, so a 49,152-entry vocabulary where Llama 3 has
# 128,256: the embedding and output matrices are smaller than the real ones,
# everything else is the shape), quantized by llama.cpp's own llama-quantize
# to the formats users download. Both engines read the same files; their text
# is noise, their speed is real.
#
#   tools/make_bench_models.sh [SHAPE...]     default: 1b 3b
#
# SHAPE: 1b (Llama-3.2-1B: hidden 2048, ffn 8192, 16 layers, 32 heads, 8 KV
# heads), 3b (Llama-3.2-3B: 3072, 8192, 28, 24, 8), 8b (Llama-3-8B: 4096,
# 14336, 32, 32, 8; the F16 file is 15 GiB, written through memory).
# default: the default model (SmolLM2-135M, weights/) requantized from its
# Q4_1 (llama-quantize --allow-requantize: the speed of a format, its quality
# a Q4_1's at best), the formats llama.cpp handles best on x86:
# build-llama/models/smollm2-135m-FMT.gguf.
# Files: build-llama/models/llama-SHAPE-{Q4_K_M,Q8_0,Q4_0}.gguf (the F16
# intermediate is removed). A file that exists is kept. Needs deploy/setup.sh
# and tools/build_llama_cpp.sh (llama-quantize). Environment: KVSERVE_VENV
# (default .venv), KVSERVE_BENCH_FORMATS (default "Q4_K_M Q8_0 Q4_0").
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${KVSERVE_VENV:-$ROOT/.venv}"
QUANTIZE="$ROOT/build-llama/bin/llama-quantize"
OUT="$ROOT/build-llama/models"
read -r -a FORMATS <<< "${KVSERVE_BENCH_FORMATS:-Q4_K_M Q8_0 Q4_0}"

fail() { echo "make_bench_models: $*" >&2; exit 1; }
[ -x "$QUANTIZE" ] || fail "$QUANTIZE missing: run tools/build_llama_cpp.sh"
[ -x "$VENV/bin/python" ] || fail "no Python environment at $VENV"

shape_args() {
  case "$1" in
    1b) echo "--hidden 2048 --ffn 8192 --layers 16 --heads 32 --kv-heads 8" ;;
    3b) echo "--hidden 3072 --ffn 8192 --layers 28 --heads 24 --kv-heads 8" ;;
    8b) echo "--hidden 4096 --ffn 14336 --layers 32 --heads 32 --kv-heads 8" ;;
    *) fail "unknown shape '$1' (default, 1b, 3b, 8b)" ;;
  esac
}

mkdir -p "$OUT"
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(1b 3b)
for shape in "${shapes[@]}"; do
  if [ "$shape" = default ]; then
    src="$ROOT/weights/SmolLM2-135M-Instruct.Q4_1.gguf"
    [ -f "$src" ] || fail "$src missing: run deploy/setup.sh"
    for fmt in "${FORMATS[@]}"; do
      out="$OUT/smollm2-135m-$fmt.gguf"
      [ -f "$out" ] && { echo "make_bench_models: $out exists"; continue; }
      "$QUANTIZE" --allow-requantize "$src" "$out.tmp" "$fmt" >"$out.log" 2>&1 ||
        fail "llama-quantize $fmt (see $out.log)"
      mv "$out.tmp" "$out"
      echo "make_bench_models: $out ($(du -h "$out" | cut -f1))"
    done
    continue
  fi
  read -r -a sargs <<< "$(shape_args "$shape")"
  f16="$OUT/llama-$shape-F16.gguf"
  for fmt in "${FORMATS[@]}"; do
    out="$OUT/llama-$shape-$fmt.gguf"
    [ -f "$out" ] && { echo "make_bench_models: $out exists"; continue; }
    if [ ! -f "$f16" ]; then
      "$VENV/bin/python" "$ROOT/tools/make_synthetic_gguf.py" \
        --out "$f16.tmp" "${sargs[@]}" || fail "make_synthetic_gguf $shape"
      mv "$f16.tmp" "$f16"
    fi
    "$QUANTIZE" "$f16" "$out.tmp" "$fmt" >"$out.log" 2>&1 ||
      fail "llama-quantize $fmt (see $out.log)"
    mv "$out.tmp" "$out"
    echo "make_bench_models: $out ($(du -h "$out" | cut -f1))"
  done
  rm -f "$f16"
done
