#!/usr/bin/env python3
"""What KV events buy a fleet: N kvserve replicas on a simulated GPU
(--device sim, no weights; step times from the roofline, slept in real
time), a workload like llm-d's precise-routing benchmark (many tenants,
each with a long shared prefix, short unique queries; the tenants' prefixes
about 75% of the fleet's KV pool), and three routing policies:

  random       a replica uniformly at random;
  approximate  the router hashes each prompt in blocks and remembers where
               it sent which blocks (an LRU per replica as large as its
               pool), as GIE's approximate prefix-cache scorer does; the
               longest remembered prefix wins, then the fewest requests in
               flight;
  precise      an index fed by the replicas' KV events (vLLM's format),
               applied as llm-d's indexer applies them
               (tests/server/llmd_kv_index.py), with llm-d's speculative
               indexing (a routed prompt's blocks count as on its pod for
               2 s, until its events can have arrived); the longest
               resident prefix wins, then the fewest requests in flight.

Scoring (--scoring llm-d, the default) is the llm-d guides' profile, as
deploy/k8s/llm-d/epp-precise.yaml configures it: 3 x the prefix score + 2 x
the KV-utilization score (1 - vllm:kv_cache_usage_perc) + 2 x the queue
score (vllm:num_requests_waiting, min-max normalized, 1 when all equal),
the gauges scraped from each replica every 50 ms (GIE's refresh interval),
the maximum taken with random ties. The precise prefix score is llm-d's:
resident blocks min-max normalized over the replicas that hold any (so any
hit scores 1); the approximate one is GIE's: matched blocks / the prompt's.
--scoring ties ranks by the longest prefix, then the fewest requests in
flight.

This router is a benchmark harness standing in for llm-d's endpoint picker
on a machine without Kubernetes: it picks the replica and sends the request
(gRPC Generate with token ids) itself. Requests arrive as a Poisson process
at --rate per second, tenants chosen uniformly. Reported per policy: TTFT
p50/p90 at the client, completed requests per second, and the prefix hit
rate (cached prompt tokens / prompt tokens, from each response's usage),
beside the oracle's hit rate (every request but a tenant's first finds its
whole prefix).

    tools/routing_bench.py --binary build/server/kvserve [--replicas 4]
        [--tenants 12] [--prefix-tokens 4096] [--rate 6] [--requests 240]
        [--repeats 3]

With --repeats, each workload (one seed) runs under every policy in a
rotated order, and ratios are paired per workload.

Needs grpcio, grpcio-tools, pyzmq, msgpack, cbor2 (deploy/setup.sh).
"""

import argparse
import collections
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "server"))
from kvserve_process import (KvserveProcess, compile_proto,  # noqa: E402
                             counter, free_port, token_ids)
import llmd_kv_index  # noqa: E402

PB = PB_GRPC = None
BLOCK = 16
MODEL = "llama3-8b"
SPECULATIVE_TTL = 2.0  # llm-d's speculativeTTL default (--speculative-ttl)



class Replica(KvserveProcess):
    def __init__(self, args, index):
        # Binds its publisher (a wildcard host), as llm-d's pod discovery
        # expects; pickers connect to self.events.
        port = free_port()
        self.events = f"tcp://127.0.0.1:{port}"
        events = f"tcp://*:{port}"
        super().__init__(
            args.binary, REPO, "--model", MODEL, "--device", args.device,
            "--sim-speed", str(args.sim_speed), "--kv-cache-bytes",
            args.kv_cache_bytes, "--max-num-seqs", "64",
            "--kv-events-endpoint", events,
            "--kv-events-topic", f"kv@replica{index}@{MODEL}",
            "--kv-events-heartbeat-ms", "200")
        import grpc
        self.pod = f"replica{index}"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)
        self.in_flight = 0

    def generate(self, ids, max_tokens):
        """(client TTFT seconds, cached prompt tokens)."""
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids),
            sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                       ignore_eos=True))
        t0 = time.monotonic()
        ttft, cached = None, 0
        for msg in self.stub.Generate(req, timeout=600):
            if ttft is None and len(msg.token_ids):
                ttft = time.monotonic() - t0
            if msg.HasField("usage"):
                cached = msg.usage.cached_prompt_tokens
        return ttft, cached

    def close(self):
        self.channel.close()
        self.kill()


class Approximate:
    """Router-side prefix memory: block-chain hashes -> the replicas they
    were sent to, an LRU of `capacity` blocks per replica."""

    def __init__(self, replicas, capacity):
        self.lru = {r.pod: collections.OrderedDict() for r in replicas}
        self.capacity = capacity

    @staticmethod
    def chain(ids):
        out, h = [], 0
        for i in range(len(ids) // BLOCK):
            h = hash((h, tuple(ids[i * BLOCK:(i + 1) * BLOCK])))
            out.append(h)
        return out

    def hits(self, pod, ids):
        lru, n = self.lru[pod], 0
        for h in self.chain(ids):
            if h not in lru:
                break
            n += 1
        return n

    def sent(self, pod, ids):
        lru = self.lru[pod]
        for h in self.chain(ids):
            lru.pop(h, None)
            lru[h] = True
        while len(lru) > self.capacity:
            lru.popitem(last=False)


class Router:
    """Binds the events endpoint (precise) before the replicas start, as
    llm-d's picker does; attach() hands it the replicas."""

    def __init__(self, policy, seed, llmd=True):
        self.policy = policy
        self.llmd = llmd
        self.stop = False
        self.scraper = self.thread = None
        self.replicas = []
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.approx = None
        self.index = None
        self.speculative = {}  # pod -> {llm-d key: expiry}
        self.speculative_ttl = SPECULATIVE_TTL
        self.trace = []  # per pick: (time, {pod: (hit, in flight)}, pod)

    def attach(self, replicas, capacity):
        self.replicas = replicas
        self.approx = Approximate(replicas, capacity)
        self.gauges = {r.pod: (0.0, 0.0) for r in replicas}
        if self.policy == "precise":
            # llm-d's pod discovery: every replica binds its publisher, every
            # picker connects to each; traffic waits for a heartbeat from
            # all (a SUB socket misses what is sent before it joins).
            self.index = llmd_kv_index.KvIndex(BLOCK)
            self.sub = llmd_kv_index.Subscriber(
                self.index, [r.events for r in replicas], bind=False)
            deadline = time.monotonic() + 30
            while len(self.sub.last) < len(replicas):
                if time.monotonic() > deadline:
                    raise TimeoutError("no heartbeat from every replica")
                self.sub.poll(100)
            self.thread = threading.Thread(target=self._follow, daemon=True)
            self.thread.start()
        if self.llmd:
            self.scraper = threading.Thread(target=self._scrape, daemon=True)
            self.scraper.start()

    def _scrape(self):
        """GIE's metrics refresh: each replica's waiting queue and KV
        utilization gauges every 50 ms."""
        while not self.stop:
            for r in self.replicas:
                try:
                    m = r.metrics()
                except OSError:
                    continue
                g = (m.get("vllm:num_requests_waiting", 0.0),
                     m.get("vllm:kv_cache_usage_perc", 0.0))
                with self.lock:
                    self.gauges[r.pod] = g
            time.sleep(0.05)

    def _follow(self):
        # Waits outside the lock; applies under it.
        while not self.stop:
            if self.sub.sub.poll(50):
                with self.lock:
                    self.sub.poll(0)

    def close(self):
        self.stop = True
        if self.scraper is not None:
            self.scraper.join()
        if self.thread is not None:
            self.thread.join()
        if self.index is not None:
            self.sub.close()

    def pick(self, ids, i=None):
        keys = (self.index.tp.keys(None, ids, MODEL)
                if self.policy == "precise" else None)
        with self.lock:
            now = time.monotonic()
            if self.policy == "random":
                r = self.rng.choice(self.replicas)
            else:
                if self.policy == "precise":
                    hits = {x.pod: max(
                        self.index.hits(x.pod, MODEL, keys=keys),
                        self.speculative_hits(x.pod, keys, now))
                        for x in self.replicas}
                else:
                    hits = {x.pod: self.approx.hits(x.pod, ids)
                            for x in self.replicas}
                score = (self.llmd_scores(hits, len(ids)) if self.llmd else
                         lambda x: (hits[x.pod], -x.in_flight))
                scores = {x.pod: (score(x), self.rng.random())
                          for x in self.replicas}
                r = max(self.replicas, key=lambda x: scores[x.pod])
                self.trace.append((now, i, {p: (hits[p], s[0])
                                            for p, s in scores.items()},
                                   r.pod))
            r.in_flight += 1
            self.approx.sent(r.pod, ids)
            if keys is not None and self.speculative_ttl > 0:
                # llm-d's speculativeIndexing: a routed prompt's blocks count
                # as on that pod until its events can have arrived.
                spec = self.speculative.setdefault(r.pod, {})
                for k in keys:
                    spec[k] = now + self.speculative_ttl
            return r

    def llmd_scores(self, hits, prompt_tokens):
        """llm-d's profile: prefix 3, KV utilization 2, queue 2."""
        if self.policy == "precise":
            held = [h for h in hits.values() if h > 0]
            lo, hi = (min(held), max(held)) if held else (0, 0)

            def prefix(pod):
                if hits[pod] == 0:
                    return 0.0
                return 1.0 if hi == lo else (hits[pod] - lo) / (hi - lo)
        else:
            blocks = max(prompt_tokens // BLOCK, 1)

            def prefix(pod):
                return hits[pod] / blocks
        waiting = {p: g[0] for p, g in self.gauges.items()}
        qlo, qhi = min(waiting.values()), max(waiting.values())

        def score(x):
            queue = 1.0 if qhi == qlo else (qhi - waiting[x.pod]) / (qhi - qlo)
            return (3 * prefix(x.pod) + 2 * (1 - self.gauges[x.pod][1]) +
                    2 * queue)
        return score

    def speculative_hits(self, pod, keys, now):
        spec, n = self.speculative.get(pod, {}), 0
        for k in keys:
            if spec.get(k, 0) < now:
                break
            n += 1
        return n

    def done(self, r):
        with self.lock:
            r.in_flight -= 1


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_policy(args, policy):
    # --pickers: active-active pickers, each request to one at random (a
    # Service in front of them); each keeps its own approximate LRU and
    # speculative entries, each precise one its own index from all events.
    routers = [Router(policy, args.seed + 1000 * k,
                      llmd=args.scoring == "llm-d")
               for k in range(args.pickers)]
    for router in routers:
        router.speculative_ttl = args.speculative_ttl
    replicas = []
    try:
        replicas = [Replica(args, i) for i in range(args.replicas)]
        for router in routers:
            router.attach(replicas, args.approx_lru_blocks or
                          blocks_of(args.kv_cache_bytes))
        rng = random.Random(args.seed)
        front = random.Random(args.seed + 7)
        prefixes = [token_ids(100 + t, args.prefix_tokens)
                    for t in range(args.tenants)]
        arrivals, t = [], 0.0
        for i in range(args.requests):
            t += rng.expovariate(args.rate)
            tenant = rng.randrange(args.tenants)
            ids = prefixes[tenant] + token_ids(10_000 + i, args.query_tokens)
            arrivals.append((t, tenant, ids, front.randrange(args.pickers)))
        results = []
        res_lock = threading.Lock()

        def send(ids, tenant, i, router):
            r = router.pick(ids, i)
            try:
                ttft, cached = r.generate(ids, args.max_tokens)
            finally:
                router.done(r)
            with res_lock:
                results.append((ttft, cached, len(ids), r.pod, tenant, i))

        threads = []
        start = time.monotonic()
        for i, (at, tenant, ids, k) in enumerate(arrivals):
            delay = start + at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            th = threading.Thread(target=send,
                                  args=(ids, tenant, i, routers[k]))
            th.start()
            threads.append(th)
        for th in threads:
            th.join()
        wall = time.monotonic() - start
        # What the precise index may have missed: batches the replicas
        # dropped (a full queue) and the subscriber never saw.
        dropped = sum(counter(r.metrics(),
                              "kvserve_kv_events_dropped_batches_total")
                      for r in replicas)
        precise = [x for x in routers if x.index is not None]
        gaps = sum(x.sub.gaps for x in precise)
        lags = sorted(lag for x in precise for lag in x.sub.lags) or [0]
    finally:
        for router in routers:
            router.close()
        for r in replicas:
            r.close()
    seen, oracle_hit = set(), 0
    for _, tenant, ids, _ in arrivals:
        if tenant in seen:
            oracle_hit += (args.prefix_tokens // BLOCK) * BLOCK
        seen.add(tenant)
    ttfts = [x[0] for x in results]
    prompt = sum(x[2] for x in results)
    per_replica = collections.Counter(x[3] for x in results)
    # Where each tenant's requests went, and how each went (TTFT, cached).
    tenants = collections.defaultdict(list)
    for ttft, cached, _, pod, tenant, i in sorted(results, key=lambda x: x[5]):
        tenants[tenant].append((pod, round(1e3 * ttft, 1), cached, i))
    return {
        "ttfts": sorted(ttfts),
        "requests_per_replica": dict(sorted(per_replica.items())),
        "ttft_p50": statistics.median(ttfts),
        "ttft_p90": percentile(ttfts, 0.9),
        "req_per_s": len(results) / wall,
        "hit_rate": sum(x[1] for x in results) / prompt,
        "oracle_hit_rate": oracle_hit / prompt,
        "events_dropped_by_replicas": dropped,
        "events_lost_before_the_index": gaps,
        "index_lag_p50_p99_max_s": [statistics.median(lags),
                                   percentile(lags, 0.99), lags[-1]],
        "tenants": dict(sorted(tenants.items())),
        "trace": sorted((round(t - start, 3), i, sc, pod)
                        for x in routers for t, i, sc, pod in x.trace),
    }


def blocks_of(size):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if size.endswith(u):
            return int(float(size[:-len(u)]) * m) // (BLOCK * 131072)
    return int(size) // (BLOCK * 131072)


def main():
    global PB, PB_GRPC
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--device", default="sim:h100")
    p.add_argument("--sim-speed", type=float, default=1.0)
    p.add_argument("--kv-cache-bytes", default="2GiB")
    p.add_argument("--tenants", type=int, default=12)
    p.add_argument("--prefix-tokens", type=int, default=4096)
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--policies", default="random,approximate,precise")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scoring", choices=("llm-d", "ties"), default="llm-d",
                   help="llm-d: its guides' 3:2:2 profile of prefix, KV "
                   "utilization and queue scorers; ties: the longest "
                   "prefix, then the fewest requests in flight")
    p.add_argument("--approx-lru-blocks", type=int, default=0,
                   help="the approximate router's LRU entries per replica "
                   "(default: the replica's pool in blocks, as GIE's sizing "
                   "note advises; GIE's default is 31250)")
    p.add_argument("--speculative-ttl", type=float, default=SPECULATIVE_TTL,
                   help="seconds a routed prompt's blocks count as on its "
                   "replica before its events arrive (llm-d's "
                   "speculativeIndexing); 0: off")
    p.add_argument("--pickers", type=int, default=1,
                   help="active-active pickers, each request to one at "
                   "random; each keeps its own state (llm-d's "
                   "active-active guide subscribes each to every pod)")
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=1,
                   help="workloads (seeds seed, seed+1, ...), each run by "
                   "every policy, the order rotated")
    args = p.parse_args()
    policies = args.policies.split(",")
    runs = {pol: [] for pol in policies}
    with tempfile.TemporaryDirectory() as tmp:
        PB, PB_GRPC = compile_proto(os.path.join(REPO, "proto"), tmp)
        base_seed = args.seed
        for k in range(args.repeats):
            args.seed = base_seed + k
            order = policies[k % len(policies):] + policies[:k %
                                                             len(policies)]
            for policy in order:
                cpu0 = os.times()
                r = run_policy(args, policy)
                cpu1 = os.times()
                r["harness_cpu_s"] = (cpu1.user - cpu0.user) + (
                    cpu1.system - cpu0.system)
                r["seed"] = args.seed
                runs[policy].append(r)
                print(f"seed {args.seed} {policy:12s} TTFT p50 "
                      f"{1e3 * r['ttft_p50']:8.1f} ms  p90 "
                      f"{1e3 * r['ttft_p90']:8.1f} ms  "
                      f"{r['req_per_s']:5.2f} req/s  hit rate "
                      f"{100 * r['hit_rate']:5.1f}% (oracle "
                      f"{100 * r['oracle_hit_rate']:5.1f}%) per replica "
                      f"{list(r['requests_per_replica'].values())} events "
                      f"dropped {r['events_dropped_by_replicas']:.0f}, lost "
                      f"{r['events_lost_before_the_index']}, index lag "
                      f"{[round(x, 3) for x in r['index_lag_p50_p99_max_s']]}",
                      flush=True)
        args.seed = base_seed
    out = {"args": vars(args), "runs": runs, "summary": {}}
    for pol, rs in runs.items():
        out["summary"][pol] = {
            k: summary([r[k] for r in rs])
            for k in ("ttft_p50", "ttft_p90", "req_per_s", "hit_rate")}
        out["summary"][pol]["hit_over_oracle"] = summary(
            [r["hit_rate"] / r["oracle_hit_rate"] for r in rs])
    if "precise" in runs:
        for other in ("random", "approximate"):
            if other in runs:
                out["summary"][f"p90_{other}_over_precise"] = summary(
                    [a["ttft_p90"] / b["ttft_p90"]
                     for a, b in zip(runs[other], runs["precise"])])
    for k, v in out["summary"].items():
        print(k, json.dumps({m: (round(x["median"], 4), round(x["min"], 4),
                                 round(x["max"], 4))
                             for m, x in v.items()} if "median" not in v
                            else (round(v["median"], 3), round(v["min"], 3),
                                  round(v["max"], 3))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


if __name__ == "__main__":
    sys.exit(main())
