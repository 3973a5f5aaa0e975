#!/usr/bin/env python3
"""Floods against a victim: what tenants, aging, fair share and the short
lane buy, measured on the real daemon (docs/PERFORMANCE.md, "Tenants under
floods"). Three scenarios, each a victim's
time to first token (TTFT) under a flood, against the same flood in the
same run with a baseline configuration:

  priority  a flood at priority -2^31 (clamped to the tenant's range) from
            one tenant keeps max-num-seqs busy; the victim, another tenant,
            sends priority 0. Configurations: fcfs (the baseline the goal
            is stated against: victim TTFT <= 3x its FCFS value), priority
            with two tenants (fair share), priority with one tenant (aging
            alone). The baseline "fcfs" is the default daemon: one tenant
            (no token file).
  cache     a flood of prompts sharing a cached 1,000-token prefix; the
            victim's 200-token prompt is fresh. Configurations: fcfs,
            cache-aware with two tenants, cache-aware with one tenant (the
            bound on passes alone).
  prefill   four long prompts prefilling at once; a short prompt arrives
            after them. Reported: its TTFT against its idle TTFT and the
            mean step during the prefills (goal: <= 2x idle + one step).

Configurations are interleaved within each repeat (one daemon per
configuration and repeat, same flags otherwise); every figure is the range
over the repeats. The client shares the machine's CPUs with the daemon:
compare only within one run.

    tools/tenant_flood_bench.py --binary build/server/kvserve \\
        --model weights/SmolLM2-135M-Instruct.Q4_1.gguf --repeats 3

--quick: one short repeat of each scenario (tests/tools/ runs it).
"""

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

FLOOD, VICTIM = "tok-flood", "tok-victim"
TOKENS = f"{FLOOD} tenant=flood\n{VICTIM} tenant=victim\n"


def words(seed, n):
    """n pseudo-random words, about 4.9 tokens each for the default model."""
    return " ".join(f"w{(seed * 7919 + k * 104729) % 9973}" for k in range(n))


class Daemon:
    def __init__(self, args, *flags):
        self.tmp = tempfile.TemporaryDirectory()
        cmd = [args.binary, "--model", args.model, "--port", "0",
               "--metrics-port", "0", "--threads", str(args.threads),
               "--kv-cache-bytes", "256MiB", "--max-model-len", "4096",
               *flags]
        if "--tenants" in flags:
            cmd.remove("--tenants")
            path = os.path.join(self.tmp.name, "tokens")
            with open(path, "w") as f:
                f.write(TOKENS)
            cmd += ["--auth-token-file", path]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.port = None
        for line in self.proc.stdout:
            m = re.search(r"listening grpc=\S+ http=\S+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            raise RuntimeError("kvserve did not start: " + " ".join(cmd))
        threading.Thread(target=lambda: [None for _ in self.proc.stdout],
                         daemon=True).start()

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.tmp.cleanup()

    def metric(self, name):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def complete(self, body, token=None, stream=False):
        """Seconds to the first token (stream) or to the answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=900)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions",
                     body=json.dumps(dict(body, stream=stream)),
                     headers=headers)
        resp = conn.getresponse()
        if resp.status != 200:
            print(f"HTTP {resp.status}: {resp.read()[:200]!r}",
                  file=sys.stderr)
            conn.close()
            return None
        first = None
        if stream:
            for line in resp:
                if line.startswith(b"data: ") and first is None:
                    first = time.perf_counter() - t0
                if line.startswith(b"data: [DONE]"):
                    break
        else:
            resp.read()
            first = time.perf_counter() - t0
        conn.close()
        return first


def flood(daemon, stop, body_of, token, clients):
    """`clients` threads looping requests until `stop` is set."""
    def loop(c):
        i = 0
        while not stop.is_set():
            daemon.complete(body_of(c, i), token)
            i += 1
    threads = [threading.Thread(target=loop, args=(c,), daemon=True)
               for c in range(clients)]
    for t in threads:
        t.start()
    return threads


def victim_under_flood(args, flags, body_of, victim_body, tenants):
    d = Daemon(args, *flags, *(["--tenants"] if tenants else []))
    try:
        stop = threading.Event()
        threads = flood(d, stop, body_of, FLOOD if tenants else None,
                        args.clients)
        time.sleep(args.warmup)
        ttft = d.complete(victim_body, VICTIM if tenants else None,
                          stream=True)
        stop.set()
        for t in threads:
            t.join(timeout=900)
        return ttft
    finally:
        d.close()


def configurations(args, policy, flood_body, victim):
    """The four runs of a flood scenario: FCFS with one and two tenants,
    `policy` with two and one."""
    seqs = ["--max-num-seqs", str(args.seqs)]
    runs = {}
    for name, flags, tenants in (
            ("fcfs", seqs, False),
            ("fcfs, 2 tenants", seqs, True),
            (f"{policy}, 2 tenants", seqs + ["--scheduling-policy", policy],
             True),
            (f"{policy}, 1 tenant", seqs + ["--scheduling-policy", policy],
             False)):
        runs[name] = (lambda flags=flags, tenants=tenants: victim_under_flood(
            args, flags, flood_body, victim, tenants))
    return runs


def scenario_priority(args):
    def flood_body(c, i):
        return {"prompt": words(c * 1000 + i, 20), "max_tokens": args.tokens,
                "ignore_eos": True, "priority": -2**31}
    victim = {"prompt": "Hello there, victim.", "max_tokens": 1,
              "priority": 0}
    return configurations(args, "priority", flood_body, victim)


def scenario_cache(args):
    prefix = words(424242, 205)  # ~1,000 tokens

    def flood_body(c, i):
        return {"prompt": prefix + words(c * 1000 + i, 8),
                "max_tokens": args.tokens, "ignore_eos": True}
    victim = {"prompt": words(777, 41), "max_tokens": 1}  # ~200 tokens
    return configurations(args, "cache-aware", flood_body, victim)


def prefill_run(args):
    d = Daemon(args, "--no-prefix-caching")
    try:
        short = {"prompt": "Hello there", "max_tokens": 1}
        idle = min(d.complete(short, stream=True) for _ in range(3))
        steps0 = d.metric("kvserve_engine_step_duration_seconds_count")
        sum0 = d.metric("kvserve_engine_step_duration_seconds_sum")
        # ~2,000-token prompts (400 words); each is prefilled in chunks.
        longs = [threading.Thread(target=d.complete, args=(
            {"prompt": words(9000 + k, args.long_words), "max_tokens": 1},),
            daemon=True) for k in range(4)]
        for t in longs:
            t.start()
        time.sleep(args.delay)
        busy = d.complete(dict(short, prompt="Hello there again"),
                          stream=True)
        for t in longs:
            t.join()
        steps = d.metric("kvserve_engine_step_duration_seconds_count") - steps0
        step = (d.metric("kvserve_engine_step_duration_seconds_sum") -
                sum0) / max(steps, 1)
        return {"idle": idle, "busy": busy, "step": step,
                "bound": 2 * idle + step}
    finally:
        d.close()


def span(values):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scenarios", default="priority,cache,prefill")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--seqs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--warmup", type=float, default=4.0)
    ap.add_argument("--long-words", type=int, default=400)
    ap.add_argument("--delay", type=float, default=0.3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.clients, args.seqs = 1, 6, 2
        args.tokens, args.warmup, args.long_words = 8, 1.0, 150
    results = {}
    wanted = args.scenarios.split(",")
    for rep in range(args.repeats):
        for name, build in (("priority", scenario_priority),
                            ("cache", scenario_cache)):
            if name not in wanted:
                continue
            for config, run in build(args).items():
                results.setdefault(name, {}).setdefault(config, []).append(
                    run())
        if "prefill" in wanted:
            r = prefill_run(args)
            for k, v in r.items():
                results.setdefault("prefill", {}).setdefault(k, []).append(v)
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr,
              flush=True)
    if args.json:
        print(json.dumps(results))
        return 0
    for name in ("priority", "cache"):
        if name not in results:
            continue
        base = results[name]["fcfs"]
        print(f"\n{name} flood: victim TTFT (s), {args.repeats} repeats")
        print("| configuration | victim TTFT (s) | / FCFS |")
        print("|---|---|---|")
        for config, values in results[name].items():
            ratios = [v / b for v, b in zip(values, base)
                      if v is not None and b]
            print(f"| {config} | {span(values)} | {span(ratios)} |")
    if "prefill" in results:
        p = results["prefill"]
        print("\nshort request behind four long prefills (s)")
        print("| idle TTFT | TTFT behind 4 prefills | mean step | "
              "2 x idle + step |")
        print("|---|---|---|---|")
        print(f"| {span(p['idle'])} | {span(p['busy'])} | {span(p['step'])} "
              f"| {span(p['bound'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
