#!/usr/bin/env python3
"""Two kvserve binaries, A B B A: batch-1 TPOT and 32-stream throughput.

Each round runs A, B, B, A; each run starts a fresh daemon of that binary on
free ports (the default model, its default KV dtype) and drives it with
tools/kvserve_bench.py over gRPC: first --batch1-requests greedy requests
one at a time (TPOT p50), then --streams-requests at --streams concurrent
(output tok/s). Prints each run, then min / median / max per binary. A
change on the engine's hot path is within noise when the ranges overlap.

    tools/abba_bench.py --a /tmp/before/build/server/kvserve \\
        --b build/server/kvserve --rounds 3
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import fair_bench  # noqa: E402
from kvserve_process import KvserveProcess  # noqa: E402


def bench(port, requests, concurrency, args):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "kvserve_bench.py"), "--target",
         f"127.0.0.1:{port}", "--no-metrics", "--num-requests", str(requests),
         "--concurrency", str(concurrency), "--input-len",
         str(args.input_len), "--output-len", str(args.output_len), "--json",
         "--no-progress"],
        capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(binary, args):
    """(batch-1 TPOT p50 in ms, many-stream output tok/s) of one daemon."""
    server = KvserveProcess(os.path.abspath(binary), ROOT, "--max-model-len",
                            str(args.input_len + args.output_len + 64),
                            "--swap-space-bytes", "0")
    try:
        one = bench(server.grpc_port, args.batch1_requests, 1, args)
        many = bench(server.grpc_port, args.streams_requests, args.streams,
                     args)
        return one["tpot_ms"]["p50"], many["output_throughput"]
    finally:
        server.kill()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="the baseline binary")
    p.add_argument("--b", required=True, help="the binary compared")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--batch1-requests", type=int, default=4)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--streams-requests", type=int, default=64)
    args = p.parse_args()
    res = {"A": ([], []), "B": ([], [])}
    for _ in range(args.rounds):
        for tag in (fair_bench.abba_order("AB", 0) +
                    fair_bench.abba_order("AB", 1)):
            tpot, tput = run(args.a if tag == "A" else args.b, args)
            res[tag][0].append(tpot)
            res[tag][1].append(tput)
            print(f"{tag}: batch-1 TPOT {tpot:.3f} ms, {args.streams} streams "
                  f"{tput:.1f} tok/s", flush=True)
    for tag in "AB":
        tpot_med, tpot_lo, tpot_hi = fair_bench.spread(res[tag][0])
        tput_med, tput_lo, tput_hi = fair_bench.spread(res[tag][1])
        print(f"{tag}: batch-1 TPOT ms min/median/max {tpot_lo:.2f} / "
              f"{tpot_med:.2f} / {tpot_hi:.2f}; {args.streams} streams tok/s "
              f"{tput_lo:.0f} / {tput_med:.0f} / {tput_hi:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
