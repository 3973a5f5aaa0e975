#!/usr/bin/env bash
# The grid of the comparison with llama.cpp (tools/bench_vs_llama_server.py,
# ../shared/FAIR-BENCH.md): one command for every figure of
# docs/PERFORMANCE.md's "Against llama.cpp at its best".
#
#   tools/fair_grid.sh [headline|full] [OUTDIR]
#
# headline (about an hour on a 2-vCPU VM, estimated from its points' times): the Llama-3.2-1B shape in
#   Q4_K_M at 1 and 16 streams and at a 4K-token prompt, in Q8_0 at batch 1;
#   the 3B shape and the Llama-3-8B shape in Q4_K_M at batch 1; the default
#   model requantized to Q8_0 at 32 streams; llama-bench on the 1B files.
# full (hours; in the background, never in CI): the headline, then the 1B
#   Q8_0 at 16 streams, the 3B shape in Q8_0, the default model in Q8_0 at
#   batch 1 and in Q4_0, an 8K context on the 1B shape (7,936 prompt
#   tokens: the shape's limit is 8,192), the 3B shape at 16 streams, Q4_0 of
#   the 1B and 3B shapes, and a Poisson sweep on the 1B shape.
#
# Each point is one run of the harness (5 A B B A repeats, both llama.cpp
# builds, each with -fa on and off, f16 KV both sides); its table goes to
# OUTDIR/NAME.md (default build-llama/grid-DATE), the grid's wall time to
# OUTDIR/time.txt. Needs deploy/setup.sh --bench (llama.cpp builds) and
# tools/make_bench_models.sh default 1b 3b 8b.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GRID="${1:-headline}"
OUTDIR="${2:-$ROOT/build-llama/grid-$(date +%Y%m%d-%H%M)}"
PY="${KVSERVE_VENV:-$ROOT/.venv}/bin/python"
M="$ROOT/build-llama/models"
case "$GRID" in headline|full) ;; *) echo "fair_grid: headline or full" >&2; exit 2 ;; esac
mkdir -p "$OUTDIR"

point() {  # NAME MODEL ARGS...
  local name="$1" model="$2"; shift 2
  [ -f "$M/$model" ] || { echo "fair_grid: $M/$model missing: tools/make_bench_models.sh" >&2; exit 2; }
  local t0=$SECONDS
  echo "fair_grid: $name ($model $*)"
  "$PY" "$ROOT/tools/bench_vs_llama_server.py" --model "$M/$model" \
    --json "$OUTDIR/$name.json" "$@" >"$OUTDIR/$name.md" 2>"$OUTDIR/$name.log"
  echo "$name $((SECONDS - t0)) s" | tee -a "$OUTDIR/time.txt"
}

start=$SECONDS
point 1b-q4km llama-1b-Q4_K_M.gguf --llama-bench --streams 1,16 --prompt-tokens 128 --max-tokens 64
point 1b-q4km-4k llama-1b-Q4_K_M.gguf --streams 1 --prompt-tokens 4096 --max-tokens 32
point 1b-q8 llama-1b-Q8_0.gguf --llama-bench --streams 1 --prompt-tokens 128 --max-tokens 64
point 3b-q4km llama-3b-Q4_K_M.gguf --streams 1 --prompt-tokens 128 --max-tokens 64
point 8b-q4km llama-8b-Q4_K_M.gguf --streams 1 --prompt-tokens 128 --max-tokens 32
point default-q8-32 smollm2-135m-Q8_0.gguf --streams 32 --prompt-tokens 128 --max-tokens 64
if [ "$GRID" = full ]; then
  point 1b-q8-16 llama-1b-Q8_0.gguf --streams 16 --prompt-tokens 128 --max-tokens 64
  point 3b-q8 llama-3b-Q8_0.gguf --llama-bench --llama-bench-repeats 2 --streams 1 --prompt-tokens 128 --max-tokens 64
  point default-q8-1 smollm2-135m-Q8_0.gguf --streams 1 --prompt-tokens 128 --max-tokens 64
  point default-q4 smollm2-135m-Q4_0.gguf --streams 1,32 --prompt-tokens 128 --max-tokens 64
  point 1b-q4km-8k llama-1b-Q4_K_M.gguf --streams 1 --prompt-tokens 7936 --max-tokens 32
  point 3b-q4km-16 llama-3b-Q4_K_M.gguf --streams 16 --prompt-tokens 128 --max-tokens 64
  point 1b-q4 llama-1b-Q4_0.gguf --llama-bench --streams 1,16 --prompt-tokens 128 --max-tokens 64
  point 3b-q4 llama-3b-Q4_0.gguf --streams 1 --prompt-tokens 128 --max-tokens 64
  point 1b-q4km-poisson llama-1b-Q4_K_M.gguf --streams 16 --request-rate 0.25,0.5,1 \
    --num-requests 24 --prompt-tokens 128 --max-tokens 64
fi
echo "fair_grid: $GRID grid $((SECONDS - start)) s" | tee -a "$OUTDIR/time.txt"
