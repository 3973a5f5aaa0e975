#!/usr/bin/env python3
"""Prefix-caching benchmark through the kvserve server (gRPC).

Starts two servers itself, one with prefix caching (the default) and one
with --no-prefix-caching, and runs the same workloads against each:

  shared:  --requests prompts = one --prefix-tokens system prompt + a unique
           --suffix-tokens tail, --concurrency at a time (after one warm-up
           request that fills the cache);
  unique:  the same shape with nothing shared (0% hits): the overhead of
           hashing and cache bookkeeping alone.

Reports per workload: requests/s, output tokens/s, mean and p50 time to
first token, and the ratios caching-on / caching-off measured in the same
run. Greedy outputs are checked equal between the two servers.

    tools/prefix_bench.py --binary build/server/kvserve [--requests 32]
        [--prefix-tokens 1000] [--suffix-tokens 16] [--max-tokens 8]
        [--concurrency 8] [--repeats 1] [--kv-cache-bytes 512MiB]
        [--threads N] [--aa] [--json out.json]

Needs grpcio and grpcio-tools (deploy/setup.sh installs them).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
from kvserve_process import (KvserveProcess, compile_proto,  # noqa: E402
                             token_ids)

PB = PB_GRPC = None


def one(stub, ids, max_tokens):
    req = PB.GenerateRequest(
        prompt_token_ids=PB.TokenIds(ids=ids),
        sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                   ignore_eos=True))
    t0 = time.monotonic()
    ttft, tokens = None, []
    for msg in stub.Generate(req, timeout=600):
        if msg.token_ids and ttft is None:
            ttft = time.monotonic() - t0
        tokens += list(msg.token_ids)
    return ttft, tokens


def run_workload(stub, prompts, max_tokens, concurrency):
    """Runs prompts with `concurrency` in flight; returns stats + outputs."""
    results = [None] * len(prompts)
    next_i = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(prompts):
                return
            results[i] = one(stub, prompts[i], max_tokens)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    ttfts = [r[0] for r in results]
    out_tokens = sum(len(r[1]) for r in results)
    return {
        "requests_per_s": len(prompts) / wall,
        "output_tokens_per_s": out_tokens / wall,
        "ttft_mean_s": statistics.mean(ttfts),
        "ttft_p50_s": statistics.median(ttfts),
        "wall_s": wall,
    }, [r[1] for r in results]


def start_server(args, caching):
    extra = [] if caching else ["--no-prefix-caching"]
    return KvserveProcess(args.binary, REPO, "--threads", str(args.threads),
                          "--kv-cache-bytes", args.kv_cache_bytes, *extra)


def bench_servers(args, workloads):
    """Runs every workload on both servers, alternating on/off within each
    repeat (so that load drift hits both alike); keeps each side's fastest
    repeat. A workload's prompts may depend on the repeat (`prompts(r)`)."""
    import grpc
    # --aa: both servers cache (an A/A run: the method's own noise floor).
    servers = {True: start_server(args, True),
               False: start_server(args, args.aa)}
    channels = {k: grpc.insecure_channel(f"127.0.0.1:{s.grpc_port}")
                for k, s in servers.items()}
    stubs = {k: PB_GRPC.KvServeStub(c) for k, c in channels.items()}
    out = {True: {}, False: {}}
    try:
        for name, (warm, prompts) in workloads.items():
            for caching in (True, False):
                if warm is not None:
                    one(stubs[caching], warm, 1)  # fills the shared prefix
            for r in range(args.repeats):
                order = (True, False) if r % 2 == 0 else (False, True)
                for caching in order:
                    stats, outputs = run_workload(stubs[caching], prompts(r),
                                                  args.max_tokens,
                                                  args.concurrency)
                    best = out[caching].get(name)
                    if best is None:  # repeat 0's outputs are compared
                        out[caching][name] = (stats, outputs)
                    elif stats["wall_s"] < best[0]["wall_s"]:
                        out[caching][name] = (stats, best[1])
        return out[True], out[False]
    finally:
        for c in channels.values():
            c.close()
        for s in servers.values():
            s.kill()


def main():
    global PB, PB_GRPC
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default=os.path.join(REPO, "build", "server",
                                                    "kvserve"))
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prefix-tokens", type=int, default=1000)
    p.add_argument("--suffix-tokens", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--kv-cache-bytes", default="512MiB")
    p.add_argument("--aa", action="store_true",
                   help="A/A run: the 'off' server caches too (noise floor)")
    p.add_argument("--json", default="")
    args = p.parse_args()

    prefix = token_ids(1, args.prefix_tokens)
    shared = [prefix + token_ids(1000 + i, args.suffix_tokens)
              for i in range(args.requests)]
    # Same lengths, nothing in common (distinct first tokens too), and a
    # fresh set per repeat so that a repeat never hits an earlier one.
    total = args.prefix_tokens + args.suffix_tokens

    def unique(r):
        return [token_ids(50000 + r * args.requests + i, total)
                for i in range(args.requests)]

    workloads = {"shared": (prefix + token_ids(999, args.suffix_tokens),
                            lambda r: shared),
                 "unique": (None, unique)}
    with tempfile.TemporaryDirectory() as d:
        PB, PB_GRPC = compile_proto(os.path.join(REPO, "proto"), d)
        on, off = bench_servers(args, workloads)

    report = {"config": vars(args), "workloads": {}}
    print(f"{'workload':8} {'caching':7} {'req/s':>8} {'tok/s':>8} "
          f"{'TTFT mean':>10} {'TTFT p50':>9}")
    for name in workloads:
        (s_on, o_on), (s_off, o_off) = on[name], off[name]
        for label, s in (("on", s_on), ("off", s_off)):
            print(f"{name:8} {label:7} {s['requests_per_s']:8.2f} "
                  f"{s['output_tokens_per_s']:8.1f} "
                  f"{s['ttft_mean_s'] * 1e3:8.1f}ms "
                  f"{s['ttft_p50_s'] * 1e3:7.1f}ms")
        ratios = {
            "throughput_on_over_off":
                s_on["requests_per_s"] / s_off["requests_per_s"],
            "ttft_mean_off_over_on": s_off["ttft_mean_s"] / s_on["ttft_mean_s"],
            "outputs_equal": o_on == o_off,
        }
        print(f"{name:8} ratios: throughput on/off "
              f"{ratios['throughput_on_over_off']:.3f}, TTFT off/on "
              f"{ratios['ttft_mean_off_over_on']:.3f}, greedy outputs equal: "
              f"{ratios['outputs_equal']}")
        report["workloads"][name] = {"on": s_on, "off": s_off, **ratios}
    overhead = 1 - report["workloads"]["unique"]["throughput_on_over_off"]
    print(f"caching overhead at 0% hits: {overhead * 100:+.2f}% throughput "
          f"(target < 1%)")
    report["overhead_at_zero_hits"] = overhead
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    ok = all(w["outputs_equal"] for w in report["workloads"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
