#!/usr/bin/env python3
"""Decode time per token along one long generation, with the full KV cache
and under kv_policy "streaming": the full cache's time per token grows with
its context (attention reads every cached token), a window's stays flat.

One kvserve (the default model, --max-model-len 8192, one request at a time)
serves both arms in ABBA order (`--repeats` rounds); each request streams
`--tokens` greedy tokens (ignore_eos) from a short prompt, the client stamps
every chunk, and the time per token is reported per bin of `--bin` output
tokens: min / median / max over the repeats. The resident KV (peak blocks,
usage.kvserve) is reported beside it.

    tools/kv_policy_bench.py --binary build/server/kvserve --source-dir . \\
        --tokens 8000 --sinks 4 --window 2032 --repeats 2 --out result.json

About 2 x repeats x (tokens / ~60 per s) on 2 vCPUs: ~9 min at the defaults.
"""

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "server"))
from kvserve_process import KvserveProcess  # noqa: E402


def generate(port, tokens, policy):
    """Streams one greedy request; returns (per-token arrival times, usage)."""
    body = {"prompt": "Once upon a time", "max_tokens": tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if policy:
        body["kv_policy"] = policy
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
        {"content-type": "application/json"})
    stamps, usage = [], None
    with urllib.request.urlopen(req, timeout=3600) as resp:
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            now = time.monotonic()
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                # One stamp per token the chunk carries (coalesced chunks
                # share their arrival time).
                n = max(1, len(c.get("token_ids") or [c.get("text")]))
                stamps.extend([now] * n)
    return stamps, usage


def per_bin(stamps, bin_tokens):
    """Milliseconds per token in each bin of output tokens (first excluded:
    it carries the prefill)."""
    out = []
    for start in range(1, len(stamps) - bin_tokens + 1, bin_tokens):
        out.append(1000 * (stamps[start + bin_tokens - 1] - stamps[start - 1])
                   / bin_tokens)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--source-dir", required=True)
    p.add_argument("--tokens", type=int, default=8000)
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--window", type=int, default=2032)
    p.add_argument("--bin", type=int, default=500)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", default="2")
    p.add_argument("--out")
    a = p.parse_args()
    policy = {"type": "streaming", "sinks": a.sinks, "window": a.window}
    server = KvserveProcess(a.binary, a.source_dir, "--threads", a.threads,
                            "--max-model-len", "8192", "--max-num-seqs", "1",
                            "--no-prefix-caching")
    arms = {"full": [], "streaming": []}
    usage = {}
    try:
        for r in range(a.repeats):
            order = ["full", "streaming"] if r % 2 == 0 else \
                ["streaming", "full"]
            for arm in order:
                stamps, u = generate(server.http_port, a.tokens,
                                     policy if arm == "streaming" else None)
                assert len(stamps) >= a.tokens, (arm, len(stamps))
                arms[arm].append(per_bin(stamps, a.bin))
                usage[arm] = u["kvserve"]
                print(f"round {r} {arm}: {a.tokens} tokens, peak "
                      f"{u['kvserve']['peak_kv_blocks']} blocks", flush=True)
    finally:
        server.kill()
    result = {"tokens": a.tokens, "bin": a.bin, "policy": policy,
              "repeats": a.repeats, "bins": {}, "peak_kv_blocks": {
                  k: v["peak_kv_blocks"] for k, v in usage.items()},
              "dropped_tokens": usage["streaming"]["dropped_tokens"]}
    print(f"{'output tokens':>15} {'full ms/token':>22} "
          f"{'streaming ms/token':>22}")
    for i in range(len(arms["full"][0])):
        row = {}
        for arm in ("full", "streaming"):
            v = [run[i] for run in arms[arm]]
            row[arm] = {"min": min(v), "median": statistics.median(v),
                        "max": max(v)}
        lo = 1 + i * a.bin
        result["bins"][f"{lo}-{lo + a.bin - 1}"] = row
        fmt = "{median:6.2f} [{min:.2f}-{max:.2f}]"
        print(f"{lo:>7}-{lo + a.bin - 1:<7} {fmt.format(**row['full']):>22} "
              f"{fmt.format(**row['streaming']):>22}")
    print(f"peak KV blocks: {result['peak_kv_blocks']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
