#!/usr/bin/env python3
"""Batch-1 decode and prefill of kvserve binaries and KV dtypes, interleaved.

For each context length, starts every (binary, dtype) configuration as a
real daemon on free ports, sends one greedy request of that many prompt
tokens and --output-len tokens out through tools/kvserve_bench.py (gRPC),
and records time to first token and time per output token. Configurations
alternate within each repetition so that a noisy machine affects them
alike; the table prints medians and each one's ratio to the first
configuration.

    tools/kv_dtype_bench.py --config OLD=/tmp/old/kvserve:f32 \\
        --config f32=build/server/kvserve:f32 \\
        --config fp16=build/server/kvserve:fp16 \\
        --contexts 256,4096 --output-len 32 --reps 2

A config is NAME=BINARY:DTYPE; DTYPE "-" passes no --kv-cache-dtype (for
binaries without the flag).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from kvserve_process import KvserveProcess  # noqa: E402


def run_one(binary, dtype, context, output_len, threads):
    extra = ["--threads", str(threads), "--max-model-len",
             str(context + output_len + 16), "--kv-cache-bytes", "2GiB",
             "--swap-space-bytes", "0"]
    if dtype != "-":
        extra += ["--kv-cache-dtype", dtype]
    server = KvserveProcess(os.path.abspath(binary), ROOT, *extra)
    try:
        out = subprocess.run(
            [sys.executable, os.path.join(HERE, "kvserve_bench.py"),
             "--target", f"127.0.0.1:{server.grpc_port}", "--metrics-url",
             f"http://127.0.0.1:{server.http_port}/metrics", "--dataset",
             "fixed", "--input-len", str(context), "--output-len",
             str(output_len), "--num-requests", "1", "--concurrency", "1",
             "--request-rate", "inf", "--json", "--no-progress"],
            capture_output=True, text=True, timeout=1800, cwd=ROOT)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        r = json.loads(out.stdout)
        return r["ttft_ms"]["p50"], r["tpot_ms"]["p50"]
    finally:
        server.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", required=True)
    ap.add_argument("--contexts", default="256,4096")
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    configs = []
    for c in args.config:
        name, rest = c.split("=", 1)
        binary, dtype = rest.rsplit(":", 1)
        configs.append((name, binary, dtype))
    contexts = [int(x) for x in args.contexts.split(",")]
    res = {}
    for ctx in contexts:
        for rep in range(args.reps):
            for name, binary, dtype in configs:
                ttft, tpot = run_one(binary, dtype, ctx, args.output_len,
                                     args.threads)
                res.setdefault((ctx, name), []).append((ttft, tpot))
                print(f"ctx {ctx} rep {rep} {name}: TTFT {ttft:.0f} ms, "
                      f"TPOT {tpot:.2f} ms", flush=True)
    print("\n| context | config | TTFT ms | TPOT ms | TPOT / first |")
    print("|---|---|---|---|---|")
    for ctx in contexts:
        base = None
        for name, _, _ in configs:
            runs = res[(ctx, name)]
            ttft = statistics.median(r[0] for r in runs)
            tpot = statistics.median(r[1] for r in runs)
            base = base or tpot
            print(f"| {ctx} | {name} | {ttft:.0f} | {tpot:.2f} | "
                  f"{tpot / base:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
