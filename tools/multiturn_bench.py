#!/usr/bin/env python3
"""Multi-turn chat with more conversations than the KV pool holds: kvserve
with the disk tier, kvserve without it, and llama.cpp's llama-server with
its RAM prompt cache (--cache-ram), at the same RAM for KV.

The workload: --users conversations of --turns turns over one shared
--system-tokens system prompt; turn t of a user is the system prompt, the
user's history (t earlier user messages of --user-tokens and replies of
--reply-tokens) and a new message; the servers answer --reply-tokens
tokens (greedy, ignore_eos). The replies put into the history are fixed
token ids (the same for every server), so every server gets the same
prompts, token for token. Turns go round robin (every user's turn 0, then
every user's turn 1, ...), one request at a time, so between two turns of
one user the others pass through the cache.

RAM for KV: a quarter of the working set (--pool-fraction): the system
prompt plus every user's whole history, at the KV bytes per token of the
KV type (`kvserve plan`; int8 = llama.cpp's q8_0, the same bytes). kvserve
gets it as its pool (--kv-cache-bytes); llama-server as its one slot's
context (-np 1, -c the longest prompt + reply rounded up to 256, which it
needs whatever its cache) plus --cache-ram for the rest (at least 1 MiB).
The disk tier comes on top of kvserve's RAM (a fresh directory each run;
what it holds is printed).

Each --repeats run starts every configuration fresh, in A B ... B A order
across runs. Recorded per run: client TTFT of every request (streaming
/v1/completions, prompt as token ids, temperature 0, top_k 1), p50 over
all requests and over turns >= 1 (turn 0 has nothing to reuse but the
system prompt), and the prompt tokens each server says it reused.
Ratios are paired per run.

    .venv/bin/python tools/multiturn_bench.py --repeats 3 [--users 16
        --turns 6 --system-tokens 2048 --user-tokens 256 --reply-tokens 64]
        [--llama-server BIN ... | --no-peer] [--json OUT]
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from bench_vs_llama_server import (DEFAULT_GGUF, DEFAULT_KVSERVE,  # noqa: E402
                                   LLAMA_KV_TYPE, LlamaServerProcess,
                                   one_request)
from kvserve_process import KvserveProcess, token_ids  # noqa: E402


def conversations(args):
    """[(user, turn, prompt ids)] in the order they are sent."""
    system = token_ids(91_000, args.system_tokens)
    history = {u: [] for u in range(args.users)}
    out = []
    for turn in range(args.turns):
        for u in range(args.users):
            msg = token_ids(92_000 + 100 * u + turn, args.user_tokens)
            out.append((u, turn, system + history[u] + msg))
            reply = token_ids(93_000 + 100 * u + turn, args.reply_tokens)
            history[u] = history[u] + msg + reply
    return out


def bytes_per_token(args):
    out = subprocess.run(
        [args.kvserve, "plan", "--model", args.model, "--kv-dtype",
         args.kv_dtype, "--json"], capture_output=True, text=True,
        check=True)
    return json.loads(out.stdout)["bytes_per_token"]


def budget(args, schedule):
    """(kvserve pool bytes, llama-server -c, llama-server --cache-ram MiB)."""
    per_token = bytes_per_token(args)
    working = args.system_tokens + args.users * args.turns * (
        args.user_tokens + args.reply_tokens)
    ram = int(working * per_token * args.pool_fraction)
    longest = max(len(p) for _, _, p in schedule) + args.reply_tokens
    ctx = (longest + 255) // 256 * 256
    cache_mib = max(1, (ram - ctx * per_token) // (1 << 20))
    return ram, ctx, cache_mib, working, per_token


def start(name, args, ram, ctx, cache_mib, disk):
    """A fresh server: kvserve+disk, kvserve, or llama-server:BINARY."""
    if name.startswith("kvserve"):
        extra = ["--model", args.model, "--threads", str(args.threads),
                 "--kv-cache-dtype", args.kv_dtype, "--kv-cache-bytes",
                 str(ram), "--max-model-len", str(ctx), "--max-num-seqs",
                 "1", "--swap-space-bytes", "0"]
        if name == "kvserve+disk":
            extra += ["--kv-disk-cache", disk]
        return KvserveProcess(args.kvserve, ROOT, *extra)
    kv = LLAMA_KV_TYPE[args.kv_dtype]
    return LlamaServerProcess(
        [name.split(":", 1)[1], "-m", args.model, "-t", str(args.threads), "-tb",
         str(args.threads), "-c", str(ctx), "-np", "1", "-ctk", kv, "-ctv",
         kv, "-fa", "on", "--cache-ram", str(cache_mib), "--no-webui"])


def run_config(name, args, schedule, ram, ctx, cache_mib):
    disk = tempfile.mkdtemp(prefix="multiturn_disk_")
    server = start(name, args, ram, ctx, cache_mib, disk)
    recs = []
    try:
        for user, turn, prompt in schedule:
            rec = asyncio.run(one_request(server.http_port, prompt,
                                          args.reply_tokens, 600))
            if rec["error"]:
                raise RuntimeError(f"{name}: {rec['error']}")
            recs.append({"user": user, "turn": turn,
                         "prompt_tokens": len(prompt),
                         "ttft": rec["first"] - rec["start"],
                         "cached": rec.get("cached_tokens")})
    finally:
        server.kill()
        disk_bytes = sum(os.path.getsize(os.path.join(r, f))
                         for r, _, fs in os.walk(disk) for f in fs)
        shutil.rmtree(disk, ignore_errors=True)
    ttft = [r["ttft"] for r in recs]
    later = [r["ttft"] for r in recs if r["turn"] >= 1]
    return {"p50": statistics.median(ttft), "p50_later": statistics.median(
        later), "cached": sum(r["cached"] or 0 for r in recs),
        "disk_bytes": disk_bytes, "requests": recs}


def fmt(xs, scale=1.0, digits=0):
    return (f"{statistics.median(xs) * scale:.{digits}f} "
            f"[{min(xs) * scale:.{digits}f}-{max(xs) * scale:.{digits}f}]")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvserve", default=DEFAULT_KVSERVE)
    p.add_argument("--llama-server", action="append",
                   help="a llama-server binary (repeatable; default both "
                   "builds of tools/build_llama_cpp.sh, with and without "
                   "OpenMP: each ratio is against the faster per run)")
    p.add_argument("--no-peer", action="store_true",
                   help="kvserve with and without the disk tier only (the "
                   "peer's run takes most of the time: repeats of the tier's "
                   "own ratio)")
    p.add_argument("--model", default=DEFAULT_GGUF)
    p.add_argument("--kv-dtype", default="int8", choices=["int8", "fp16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--system-tokens", type=int, default=2048)
    p.add_argument("--user-tokens", type=int, default=256)
    p.add_argument("--reply-tokens", type=int, default=64)
    p.add_argument("--pool-fraction", type=float, default=0.25)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    args.llama_server = args.llama_server or [
        os.path.join(ROOT, d, "bin", "llama-server")
        for d in ("build-llama", "build-llama-noomp")]
    schedule = conversations(args)
    ram, ctx, cache_mib, working, per_token = budget(args, schedule)
    print(f"{args.users} users x {args.turns} turns, system "
          f"{args.system_tokens}, +{args.user_tokens}/+{args.reply_tokens} "
          f"a turn: working set {working} tokens ({working * per_token / 2**20:.1f} "
          f"MiB at {per_token} B/token); RAM for KV {ram / 2**20:.1f} MiB: "
          f"kvserve pool; llama-server -c {ctx} "
          f"({ctx * per_token / 2**20:.1f} MiB) + --cache-ram {cache_mib}",
          flush=True)
    llamas = ([] if args.no_peer else
              [f"llama-server:{b}" for b in args.llama_server])
    names = ["kvserve+disk", "kvserve", *llamas]
    runs = {n: [] for n in names}
    for r in range(args.repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            res = run_config(name, args, schedule, ram, ctx, cache_mib)
            runs[name].append(res)
            print(f"run {r} {name}: TTFT p50 {res['p50'] * 1e3:.0f} ms, "
                  f"turns >= 1 {res['p50_later'] * 1e3:.0f} ms, "
                  f"{res['cached']} prompt tokens reused"
                  + (f", disk {res['disk_bytes'] / 2**20:.0f} MiB"
                     if res["disk_bytes"] else ""), flush=True)
    for key, label in (("p50", "all turns"), ("p50_later", "turns >= 1")):
        d = [x[key] for x in runs["kvserve+disk"]]
        k = [x[key] for x in runs["kvserve"]]
        line = (f"TTFT p50 ({label}): kvserve+disk {fmt(d, 1e3)} ms, kvserve "
                f"{fmt(k, 1e3)} ms; no tier / disk "
                f"{fmt([b / a for a, b in zip(d, k)], digits=2)}x")
        if llamas:
            # The peer's best build in each run.
            ll = [min(runs[n][r][key] for n in llamas)
                  for r in range(args.repeats)]
            for n in llamas:
                print(f"  {n}: {fmt([x[key] for x in runs[n]], 1e3)} ms",
                      flush=True)
            line += (f"; llama-server {fmt(ll, 1e3)} ms, llama-server / disk "
                     f"{fmt([b / a for a, b in zip(d, ll)], digits=2)}x")
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "ram": ram, "ctx": ctx,
                       "cache_ram_mib": cache_mib, "runs": runs}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
