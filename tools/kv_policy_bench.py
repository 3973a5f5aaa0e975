#!/usr/bin/env python3
"""Decode time per token along one long generation, with the full KV cache
and under kv_policy "streaming": the full cache's time per token grows with
its context (attention reads every cached token), a window's stays flat.

A third arm, `heavy_hitters` (`--arms full,streaming,heavy_hitters`), holds
the streaming arm's peak KV as its budget with a `--hh-window` recent window:
what computing each block's attention mass costs a decode.

One kvserve (the default model, --max-model-len 8192, one request at a time)
serves the arms in ABBA order (`--repeats` rounds); each request streams
`--tokens` greedy tokens (ignore_eos) from a short prompt, the client stamps
every chunk, and the time per token is reported per bin of `--bin` output
tokens: min / median / max over the repeats. The resident KV (peak blocks,
usage.kvserve) is reported beside it.

    tools/kv_policy_bench.py --binary build/server/kvserve --source-dir . \\
        --tokens 8000 --sinks 4 --window 2032 --repeats 2 --out result.json

About 2 x repeats x (tokens / ~60 per s) on 2 vCPUs: ~9 min at the defaults.

The endless run (100,000 tokens, far past the trained context,
streaming only; ~20 min):

    tools/kv_policy_bench.py --binary build/server/kvserve --source-dir . \\
        --arms streaming --repeats 1 --tokens 100000 --bin 5000 \\
        --max-model-len 4096 --window 2032 --out endless.json

It also samples the server's active KV blocks every few seconds and
compares the time per token of the first and the last bins after the
window has filled (the "flat" check: within +-5%).
"""

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
import urllib.error
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
    try:
        resp = urllib.request.urlopen(req, timeout=3600)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read().decode()}") from None
    with resp:
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


class BlockSampler:
    """Polls /metrics for kvserve_kv_blocks{state="active"} every `period`
    seconds on a thread of its own until stop()."""

    PATTERN = re.compile(r'^kvserve_kv_blocks\{[^}]*state="active"[^}]*\} '
                         r'([0-9.e+]+)$', re.M)

    def __init__(self, port, period=5.0):
        self.port, self.period, self.samples = port, period, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.done.wait(self.period):
            url = f"http://127.0.0.1:{self.port}/metrics"
            with urllib.request.urlopen(url, timeout=30) as resp:
                m = self.PATTERN.search(resp.read().decode())
            if m:
                self.samples.append(float(m.group(1)))

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.samples


def flatness(bins, bin_tokens, filled_at):
    """Median ms/token of the first and the last fifth of the bins that
    start after `filled_at` output tokens, and last / first."""
    steady = [v for i, v in enumerate(bins) if 1 + i * bin_tokens > filled_at]
    if len(steady) < 2:
        return None
    k = max(1, len(steady) // 5)
    first = statistics.median(steady[:k])
    last = statistics.median(steady[-k:])
    return {"first_ms": first, "last_ms": last, "ratio": last / first,
            "bins_each": k}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--source-dir", required=True)
    p.add_argument("--tokens", type=int, default=8000)
    p.add_argument("--sinks", type=int, default=4)
    p.add_argument("--window", type=int, default=2032)
    p.add_argument("--hh-window", type=int, default=512,
                   help="the heavy_hitters arm's recent window; its budget "
                   "is the streaming arm's peak (sinks' block + --window)")
    p.add_argument("--bin", type=int, default=500)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", default="2")
    p.add_argument("--arms", default="full,streaming",
                   help="some of full,streaming,heavy_hitters in ABBA order "
                   "(streaming alone for --tokens past the model's context)")
    p.add_argument("--max-model-len", default="8192")
    p.add_argument("--out")
    a = p.parse_args()
    policy = {"type": "streaming", "sinks": a.sinks, "window": a.window}
    sink_tokens = -(-a.sinks // 16) * 16
    policies = {"full": None, "streaming": policy,
                "heavy_hitters": {"type": "heavy_hitters", "sinks": a.sinks,
                                  "window": a.hh_window,
                                  "budget": sink_tokens + a.window}}
    server = KvserveProcess(a.binary, a.source_dir, "--threads", a.threads,
                            "--max-model-len", a.max_model_len,
                            "--max-num-seqs", "1", "--no-prefix-caching",
                            # One call may ask for prompt + --tokens.
                            "--max-request-tokens", str(a.tokens + 1024))
    names = a.arms.split(",")
    arms = {k: [] for k in names}
    usage = {}
    sampler = BlockSampler(server.http_port)
    try:
        for r in range(a.repeats):
            order = names if r % 2 == 0 else names[::-1]
            for arm in order:
                stamps, u = generate(server.http_port, a.tokens,
                                     policies[arm])
                assert len(stamps) >= a.tokens, (arm, len(stamps))
                arms[arm].append(per_bin(stamps, a.bin))
                usage[arm] = u["kvserve"]
                print(f"round {r} {arm}: {a.tokens} tokens, peak "
                      f"{u['kvserve']['peak_kv_blocks']} blocks", flush=True)
    finally:
        blocks = sampler.stop()
        server.kill()
    result = {"tokens": a.tokens, "bin": a.bin,
              "policies": {k: policies[k] for k in names},
              "max_model_len": int(a.max_model_len),
              "repeats": a.repeats, "bins": {}, "peak_kv_blocks": {
                  k: v["peak_kv_blocks"] for k, v in usage.items()},
              "active_blocks_sampled": {"min": min(blocks, default=0),
                                        "max": max(blocks, default=0),
                                        "samples": len(blocks)}}
    if "streaming" in usage:
        result["dropped_tokens"] = usage["streaming"]["dropped_tokens"]
        medians = [statistics.median(run[i] for run in arms["streaming"])
                   for i in range(len(arms["streaming"][0]))]
        result["streaming_flatness"] = flatness(medians, a.bin,
                                                a.sinks + a.window + 16)
    print(f"{'output tokens':>15} " +
          " ".join(f"{arm + ' ms/token':>22}" for arm in names))
    for i in range(len(arms[names[0]][0])):
        row = {}
        for arm in names:
            v = [run[i] for run in arms[arm]]
            row[arm] = {"min": min(v), "median": statistics.median(v),
                        "max": max(v)}
        lo = 1 + i * a.bin
        result["bins"][f"{lo}-{lo + a.bin - 1}"] = row
        fmt = "{median:6.2f} [{min:.2f}-{max:.2f}]"
        print(f"{lo:>7}-{lo + a.bin - 1:<7} " +
              " ".join(f"{fmt.format(**row[arm]):>22}" for arm in names))
    print(f"peak KV blocks: {result['peak_kv_blocks']}; active blocks "
          f"sampled: {result['active_blocks_sampled']}")
    if result.get("streaming_flatness"):
        print(f"streaming flatness (after the window fills): "
              f"{result['streaming_flatness']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
