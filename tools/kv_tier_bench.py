#!/usr/bin/env python3
"""KV disk tier benchmark through the real daemon (gRPC), all ratios from
one run:

  restart:  per prompt length (--lengths, default 4096 and 8000 tokens):
            TTFT of the prompt computed cold (a fresh daemon, nothing
            cached); then, after a SIGTERM and a restart on the same
            --kv-disk-cache, TTFT of the same prompt served from disk with
            the files in the page cache ("disk warm"), after another restart
            with the files dropped from the page cache
            (posix_fadvise DONTNEED, "disk cold"), the same prompt again in
            that daemon's pool ("pool hit"), and once more after two other
            prompts pushed it out of the pool ("running": a disk hit into
            pool pages already in use, as in a daemon that has served a
            while; a restarted daemon's first loads also fault its pool's
            pages in; right after the other two prompts' 100 MB of writes),
            and in steady state ("steady": the three prompts requested in
            turn through a pool that holds two, --steady-rounds times, so
            every request is a disk hit and none writes; the median).
  overhead: tiers on with no hits vs tiers off: TTFT of unique --overhead-
            tokens prompts and the output throughput of --streams
            concurrent unique requests, the two daemons alternated (A B B A);
            --fresh-daemons starts a new daemon for every run (two
            long-lived processes can differ by more than the overhead);
            --only-overhead skips the restart figures.
  --remote: the shared tier instead (a redis-server started here, with a
            password): per --lengths, replica A computes a prompt cold,
            replica B (running beside it, on the same store) serves it from
            the store ("remote hit"), then from its own pool ("pool hit");
            and the overhead figures with the remote tier on.

Each figure is the median [min-max] over --repeats, every repeat a new
prompt. Greedy outputs are checked equal between cold and disk runs.

    tools/kv_tier_bench.py --binary build/server/kvserve [--repeats 5]
        [--lengths 4096,8000] [--streams 32] [--remote] [--json out.json]

Needs grpcio and grpcio-tools (deploy/setup.sh installs them).
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
from kvserve_process import (KvserveProcess, RedisServer,  # noqa: E402
                             compile_proto, thread_cpu_seconds, token_ids)

PB = PB_GRPC = None


class Daemon(KvserveProcess):
    def __init__(self, args, disk=None, pool_bytes=None, remote=None):
        extra = ["--threads", str(args.threads), "--kv-cache-bytes",
                 str(pool_bytes or args.kv_cache_bytes), "--max-model-len",
                 "8192"]
        if disk:
            extra += ["--kv-disk-cache", disk]
        if remote:
            extra += remote.flags()
        super().__init__(args.binary, REPO, *extra)
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def generate(self, ids, max_tokens):
        """(server TTFT seconds, tokens, usage)."""
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids),
            sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                       ignore_eos=True))
        tokens, usage, ttft = [], None, None
        for msg in self.stub.Generate(req, timeout=900):
            tokens += list(msg.token_ids)
            if msg.HasField("usage"):
                usage = msg.usage
            if msg.HasField("timings"):
                ttft = msg.timings.time_to_first_token_seconds
        return ttft, tokens, usage

    def wait_writes(self, timeout=120):
        """Until the disk writer is idle: stores (and drops) stop growing.
        Measurements then see the tier's reads alone, not its writes of
        the requests before."""
        def done(m):
            return sum(v for k, v in m.items() if k.startswith(
                ("kvserve_kv_tier_stores_total",
                 "kvserve_kv_tier_stores_dropped_total")))
        last, deadline = -1, time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = done(self.metrics())
            if now == last:
                return
            last = now
            time.sleep(0.3)

    def stop(self):
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)
        self.kill()

    def close(self):
        self.channel.close()
        self.kill()


def drop_page_cache(disk):
    n = 0
    for root, _, files in os.walk(disk):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
            n += 1
    return n


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs),
            "runs": xs}


def restart_point(args, length, repeat):
    """One repeat of the restart figures for one prompt length."""
    disk = tempfile.mkdtemp(prefix="kv_tier_bench_")
    ids = token_ids(1000 * length + repeat, length)
    try:
        d = Daemon(args, disk)
        try:
            cold, ref, u = d.generate(ids, args.max_tokens)
            assert u.cached_prompt_tokens == 0, u
        finally:
            d.stop()
        out = {"cold": cold}
        for name, drop in (("disk_warm", False), ("disk_cold", True)):
            if drop:
                drop_page_cache(disk)
            # The pool holds two such prompts (default model, int8 KV).
            d = Daemon(args, disk, pool_bytes=2 * (length + 64) * 12240)
            try:
                ttft, tokens, u = d.generate(ids, args.max_tokens)
                if tokens != ref:
                    raise RuntimeError(f"{name}: tokens differ from cold")
                if u.kv.cached_tokens_by_tier.disk == 0:
                    raise RuntimeError(f"{name}: no disk hit: {u}")
                out[name] = ttft
                out[f"{name}_load"] = d.metrics().get(
                    "kvserve_kv_tier_load_seconds_sum", 0.0)
                out["cached"] = u.cached_prompt_tokens
                if drop:
                    out["pool_hit"], _, _ = d.generate(ids, args.max_tokens)
                    # Two other prompts push it out of the pool (sized
                    # for two); its pages stay touched, as in a daemon that
                    # has been serving: then a disk hit again.
                    for other in (1, 2):
                        d.generate(token_ids(5_000_000 * other + repeat,
                                             length), 1)
                    d.wait_writes()
                    ttft, tokens, u = d.generate(ids, args.max_tokens)
                    if (tokens != ref or
                            u.kv.cached_tokens_by_tier.disk == 0):
                        raise RuntimeError(f"evicted: no disk hit: {u}")
                    out["disk_running"] = ttft
                    # Steady state: the three prompts in turn through a
                    # pool of two, so each request is a disk hit and no
                    # request writes (all blocks are on disk already).
                    steady = []
                    for _ in range(args.steady_rounds):
                        for other in (1, 2):
                            d.generate(token_ids(5_000_000 * other + repeat,
                                                 length), 1)
                        ttft, tokens, u = d.generate(ids, args.max_tokens)
                        if (tokens != ref or
                                u.kv.cached_tokens_by_tier.disk == 0):
                            raise RuntimeError(f"steady: no disk hit: {u}")
                        steady.append(ttft)
                    out["disk_steady"] = statistics.median(steady)
            finally:
                d.stop()
        return out
    finally:
        shutil.rmtree(disk, ignore_errors=True)


def remote_point(args, redis, length, repeat):
    """One repeat of the shared-store figures: A computes, B loads."""
    ids = token_ids(3_000_000 + 1000 * length + repeat, length)
    a = Daemon(args, remote=redis)
    b = Daemon(args, remote=redis)
    try:
        cold, ref, u = a.generate(ids, args.max_tokens)
        assert u.cached_prompt_tokens == 0, u
        a.wait_writes()
        hit, tokens, u = b.generate(ids, args.max_tokens)
        if tokens != ref:
            raise RuntimeError("remote hit: tokens differ from cold")
        if u.kv.cached_tokens_by_tier.remote == 0:
            raise RuntimeError(f"no remote hit: {u}")
        pool, _, _ = b.generate(ids, args.max_tokens)
        return {"cold": cold, "remote_hit": hit, "pool_hit": pool,
                "remote_load": b.metrics().get(
                    "kvserve_kv_tier_load_seconds_sum", 0.0),
                "cached": u.kv.cached_tokens_by_tier.remote}
    finally:
        a.close()
        b.close()


def throughput(d, prompts, max_tokens):
    """Output tokens/s of all prompts at once, and the CPU microseconds per
    output token of the engine thread and of the tiers' own threads (thread
    CPU clocks: the overhead without the machine's run-to-run noise in
    throughput)."""
    results = [None] * len(prompts)

    def run(i):
        results[i] = d.generate(prompts[i], max_tokens)

    pid = d.proc.pid
    in_tiers = "kvserve_kv_tier_engine_cpu_seconds_total"
    cpu0 = (thread_cpu_seconds(pid, "kv-engine"),
            thread_cpu_seconds(pid, "kv-tier"), d.metrics().get(in_tiers, 0))
    t0 = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,))
               for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    # Writes of these requests' blocks finish after the last reply.
    if hasattr(d, "wait_writes"):
        d.wait_writes()
    tokens = sum(len(r[1]) for r in results)
    return (tokens / wall,
            1e6 * (thread_cpu_seconds(pid, "kv-engine") - cpu0[0]) / tokens,
            1e6 * (thread_cpu_seconds(pid, "kv-tier") - cpu0[1]) / tokens,
            1e6 * (d.metrics().get(in_tiers, 0) - cpu0[2]) / tokens)


def overhead(args, redis=None):
    """Tiers on (no hits) vs off, A B B A: the disk tier, or the remote.
    --fresh-daemons: a new daemon (and disk directory) for every run, so no
    process's own bias (memory placement, its history) sits on one side."""
    disk = tempfile.mkdtemp(prefix="kv_tier_bench_")

    def start(name):
        if name == "off":
            return Daemon(args)
        return Daemon(args, remote=redis) if redis else Daemon(args, disk)

    daemons = {} if args.fresh_daemons else {n: start(n) for n in
                                             ("on", "off")}
    res = {n: {"ttft": [], "tok_s": [], "engine_us_per_tok": [],
               "tier_us_per_tok": [], "engine_in_tiers_us_per_tok": []}
           for n in ("on", "off")}
    seed = [0]

    def unique(n):
        seed[0] += 1
        return token_ids(7_000_000 + seed[0], n)

    try:
        for r in range(args.repeats):
            order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
            for name in order:
                d = daemons.get(name) or start(name)
                try:
                    if name == "on":
                        d.wait_writes()
                    ttft, _, _ = d.generate(unique(args.overhead_tokens), 1)
                    res[name]["ttft"].append(ttft)
                    prompts = [unique(128) for _ in range(args.streams)]
                    tok_s, engine, tier, in_tiers = throughput(
                        d, prompts, args.max_tokens_streams)
                    res[name]["tok_s"].append(tok_s)
                    res[name]["engine_us_per_tok"].append(engine)
                    res[name]["tier_us_per_tok"].append(tier)
                    res[name]["engine_in_tiers_us_per_tok"].append(in_tiers)
                finally:
                    if args.fresh_daemons:
                        d.close()
    finally:
        for d in daemons.values():
            d.close()
        shutil.rmtree(disk, ignore_errors=True)
    ratios = {
        "ttft": [a / b for a, b in zip(res["on"]["ttft"], res["off"]["ttft"])],
        "tok_s": [a / b for a, b in zip(res["on"]["tok_s"],
                                        res["off"]["tok_s"])],
        "engine_cpu": [a / b for a, b in zip(res["on"]["engine_us_per_tok"],
                                             res["off"]["engine_us_per_tok"])],
        # The tiers' calls' share of the engine thread, on its own clock.
        "engine_share_in_tiers": [
            a / b for a, b in zip(res["on"]["engine_in_tiers_us_per_tok"],
                                  res["on"]["engine_us_per_tok"])]}
    return {k: {m: summary(v) for m, v in res[k].items()}
            for k in res} | {"ratio_on_off": {k: summary(v)
                                              for k, v in ratios.items()}}


def print_cpu(o):
    print(f"  engine thread CPU per output token: on "
          f"{fmt(o['on']['engine_us_per_tok'])} us, off "
          f"{fmt(o['off']['engine_us_per_tok'])} us, on / off "
          f"{fmt(o['ratio_on_off']['engine_cpu'], digits=3)}; in the tiers' "
          f"calls {fmt(o['on']['engine_in_tiers_us_per_tok'], digits=2)} us "
          f"({fmt(o['ratio_on_off']['engine_share_in_tiers'], 100, 3)}% of "
          f"the engine thread); the tier threads' (kv-tier-*) "
          f"{fmt(o['on']['tier_us_per_tok'])} us", flush=True)


def fmt(s, scale=1.0, digits=1):
    return (f"{s['median'] * scale:.{digits}f} "
            f"[{s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f}]")


def main():
    global PB, PB_GRPC
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--lengths", default="4096,8000")
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--kv-cache-bytes", default="512MiB")
    p.add_argument("--overhead-tokens", type=int, default=1024)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--max-tokens-streams", type=int, default=64)
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--steady-rounds", type=int, default=5)
    p.add_argument("--fresh-daemons", action="store_true",
                   help="overhead: a new daemon for every run")
    p.add_argument("--only-overhead", action="store_true")
    p.add_argument("--remote", action="store_true")
    p.add_argument("--json")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        PB, PB_GRPC = compile_proto(os.path.join(REPO, "proto"), out)
        result = {"restart": {}, "args": vars(args)}
        if args.remote:
            return remote_main(args, out, result)
        lengths = [] if args.only_overhead else args.lengths.split(",")
        for length in (int(x) for x in lengths):
            runs = [restart_point(args, length, r)
                    for r in range(args.repeats)]
            point = {k: summary([r[k] for r in runs])
                     for k in ("cold", "disk_warm", "disk_cold", "pool_hit",
                               "disk_running", "disk_steady",
                               "disk_warm_load",
                               "disk_cold_load")}
            for k in ("disk_warm", "disk_cold"):
                point[f"speedup_{k}"] = summary(
                    [r["cold"] / r[k] for r in runs])
            point["disk_warm_over_pool"] = summary(
                [r["disk_warm"] / r["pool_hit"] for r in runs])
            point["disk_running_over_pool"] = summary(
                [r["disk_running"] / r["pool_hit"] for r in runs])
            point["disk_steady_over_pool"] = summary(
                [r["disk_steady"] / r["pool_hit"] for r in runs])
            point["cached"] = runs[0]["cached"]
            result["restart"][length] = point
            print(f"prompt {length}: cold {fmt(point['cold'], 1e3)} ms, "
                  f"disk warm {fmt(point['disk_warm'], 1e3)} ms "
                  f"({fmt(point['speedup_disk_warm'])}x), disk cold "
                  f"{fmt(point['disk_cold'], 1e3)} ms "
                  f"({fmt(point['speedup_disk_cold'])}x), pool hit "
                  f"{fmt(point['pool_hit'], 1e3)} ms; disk warm / pool hit "
                  f"{fmt(point['disk_warm_over_pool'], digits=2)}; in a "
                  f"running daemon {fmt(point['disk_running'], 1e3)} ms, "
                  f"/ pool hit "
                  f"{fmt(point['disk_running_over_pool'], digits=2)}; "
                  f"steady {fmt(point['disk_steady'], 1e3)} ms, / pool hit "
                  f"{fmt(point['disk_steady_over_pool'], digits=2)}; load "
                  f"(warm, cold) {fmt(point['disk_warm_load'], 1e3)}, "
                  f"{fmt(point['disk_cold_load'], 1e3)} ms; "
                  f"{point['cached']} cached tokens", flush=True)
        if not args.skip_overhead:
            o = overhead(args)
            result["overhead"] = o
            r = o["ratio_on_off"]
            print(f"tiers on / off, no hits: TTFT ({args.overhead_tokens} "
                  f"tokens) {fmt(r['ttft'], digits=3)}, {args.streams} "
                  f"streams out tok/s {fmt(r['tok_s'], digits=3)}; on "
                  f"{fmt(o['on']['tok_s'])} tok/s, off "
                  f"{fmt(o['off']['tok_s'])} tok/s", flush=True)
            print_cpu(o)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    return 0


def remote_main(args, tmp, result):
    redis = RedisServer(tmp)
    result["remote"] = {}
    try:
        lengths = [] if args.only_overhead else args.lengths.split(",")
        for length in (int(x) for x in lengths):
            runs = [remote_point(args, redis, length, r)
                    for r in range(args.repeats)]
            point = {k: summary([r[k] for r in runs])
                     for k in ("cold", "remote_hit", "pool_hit",
                               "remote_load")}
            point["speedup"] = summary(
                [r["cold"] / r["remote_hit"] for r in runs])
            point["remote_over_pool"] = summary(
                [r["remote_hit"] / r["pool_hit"] for r in runs])
            point["cached"] = runs[0]["cached"]
            result["remote"][length] = point
            print(f"prompt {length}: cold on replica A "
                  f"{fmt(point['cold'], 1e3)} ms, remote hit on replica B "
                  f"{fmt(point['remote_hit'], 1e3)} ms "
                  f"({fmt(point['speedup'])}x), then pool hit "
                  f"{fmt(point['pool_hit'], 1e3)} ms; remote / pool "
                  f"{fmt(point['remote_over_pool'], digits=2)}; load "
                  f"{fmt(point['remote_load'], 1e3)} ms; "
                  f"{point['cached']} tokens from the store", flush=True)
        if not args.skip_overhead:
            o = overhead(args, redis)
            result["overhead_remote"] = o
            r = o["ratio_on_off"]
            print(f"remote tier on / off, no hits: TTFT "
                  f"({args.overhead_tokens} tokens) "
                  f"{fmt(r['ttft'], digits=3)}, {args.streams} streams out "
                  f"tok/s {fmt(r['tok_s'], digits=3)}", flush=True)
            print_cpu(o)
    finally:
        redis.stop()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
