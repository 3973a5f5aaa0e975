#!/usr/bin/env python3
"""Correctness fuzz of the KV tiers through the real daemon: simulated
users of several tenants (three with private cache scopes, two sharing
one) and cache_salts send prompts that overlap across all of them (the
same shared prefixes, token for token, in every namespace), into a small
pool over a disk tier and a Redis tier, with the daemon restarted between
epochs (SIGTERM: the pool empties, the tiers stay). Checks:

  - every greedy output equals the output of the same prompt on a daemon
    without tiers;
  - no hit crosses a namespace: a request's cached_tokens never exceed the
    longest prefix an earlier prompt of its own (scope, cache_salt) shared
    with it (whole blocks only in the shared scope), though every prompt
    prefix was also seen in other namespaces;
  - the tiers served some of those hits (after the restarts, only they
    can), and the split by tier sums to cached_tokens.

    kv_tier_fuzz_test.py --binary build/server/kvserve --source-dir .

Cost: about 60 s with the default KVSERVE_FUZZ_REQUESTS=160 (3 epochs);
the recorded run is KVSERVE_FUZZ_REQUESTS=10000 KVSERVE_FUZZ_USERS=200.
"""

import os
import random
import shutil
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, RedisServer,  # noqa: E402
                             metric_sum, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
REQUESTS = int(os.environ.get("KVSERVE_FUZZ_REQUESTS", "160"))
USERS = int(os.environ.get("KVSERVE_FUZZ_USERS", "24"))
EPOCHS = 3
BLOCK = 16
# Tenants: (name, cache scope key as the daemon builds it, shared scope).
TENANTS = [("t0", "tenant:t0", False), ("t1", "tenant:t1", False),
           ("t2", "tenant:t2", False), ("t3", "scope:team", True),
           ("t4", "scope:team", True)]
PREFIXES = [token_ids(700 + i, 48) for i in range(4)]


def token_of(tenant):
    return f"fuzz-token-{tenant}-0123456789abcdef"


class User:
    def __init__(self, i):
        self.tenant = TENANTS[i % len(TENANTS)]
        r = i % 4
        self.salt = None if r == 0 else f"salt{(i // 4) % 3}"
        self.prefix = PREFIXES[i % len(PREFIXES)]
        # Every user's continuation starts like some others' (a second
        # level of overlap), then is its own.
        self.history = token_ids(800 + i % 6, 32) + token_ids(5000 + i, 96)

    def namespace(self):
        return (self.tenant[1], self.salt)

    def prompt(self, rng):
        return self.prefix + self.history[:rng.randrange(8, 128)]


class Daemon(KvserveProcess):
    def __init__(self, tokens_file, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", "6MiB", "--max-model-len", "512",
                         "--kv-cache-dtype", "int8", *extra,
                         *(["--auth-token-file", tokens_file]
                           if tokens_file else []))
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def generate(self, ids, tenant=None, salt=None):
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids),
            sampling=PB.SamplingParams(temperature=0, max_tokens=4,
                                       ignore_eos=True))
        if salt is not None:
            req.cache_salt = salt
        md = [("authorization", f"Bearer {token_of(tenant)}")] if tenant \
            else None
        tokens, usage = [], None
        for msg in self.stub.Generate(req, timeout=300, metadata=md):
            tokens.extend(msg.token_ids)
            if msg.HasField("usage"):
                usage = msg.usage
        return tokens, usage

    def stop(self):
        self.channel.close()
        return self.terminate()


def common_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class TierFuzzTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvserve_fuzz_")
        self.tokens = os.path.join(self.tmp, "tokens")
        with open(self.tokens, "w") as f:
            for name, scope, _ in TENANTS:
                line = f"{token_of(name)} tenant={name}"
                if scope.startswith("scope:"):
                    line += f" cache_scope={scope[len('scope:'):]}"
                f.write(line + "\n")
        self.redis = RedisServer(self.tmp)

    def tearDown(self):
        self.redis.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_outputs_equal_and_no_hit_crosses_a_namespace(self):
        rng = random.Random(1234)
        users = [User(i) for i in range(USERS)]
        plan = [(u, u.prompt(rng)) for u in
                (users[rng.randrange(USERS)] for _ in range(REQUESTS))]
        # The reference: a daemon without tiers (and without tenants).
        ref = {}
        d = Daemon(None)
        try:
            for _, p in plan:
                if tuple(p) not in ref:
                    ref[tuple(p)] = d.generate(p)[0]
        finally:
            d.kill()
        seen = {}  # namespace -> prompts sent so far (any epoch)
        stats = {"tier_tokens": 0, "cached": 0, "opportunities": 0}
        lock = threading.Lock()
        errors = []
        disk = os.path.join(self.tmp, "kv")
        per_epoch = (len(plan) + EPOCHS - 1) // EPOCHS
        for epoch in range(EPOCHS):
            part = plan[epoch * per_epoch:(epoch + 1) * per_epoch]
            d = Daemon(self.tokens, "--kv-disk-cache", disk,
                       *self.redis.flags())
            try:
                self.run_epoch(d, part, ref, seen, stats, lock, errors)
                m = d.metrics()
                stats["remote_hits"] = stats.get("remote_hits", 0) + \
                    metric_sum(m, "kvserve_kv_tier_hits_blocks_total",
                               tier="remote")
            finally:
                code = d.stop()
            self.assertEqual(errors, [])
            self.assertEqual(code, 0, d.text()[-2000:])
        print(f"fuzz: {len(plan)} requests from {USERS} users, "
              f"{len(ref)} distinct prompts; {stats['cached']} cached "
              f"tokens, {stats['tier_tokens']} of them from the tiers; "
              f"{stats['opportunities']} requests whose prefix another "
              f"namespace held longer than their own", flush=True)
        self.assertGreater(stats["tier_tokens"], 0)
        self.assertGreater(stats["opportunities"], 0)

    def run_epoch(self, d, part, ref, seen, stats, lock, errors):
        todo = list(part)

        def client():
            while True:
                with lock:
                    if not todo or errors:
                        return
                    user, prompt = todo.pop(0)
                    ns = user.namespace()
                    mine = len(seen.setdefault(ns, []))
                    seen[ns].append(prompt)
                try:
                    out, usage = d.generate(prompt, user.tenant[0],
                                            user.salt)
                except Exception as e:  # noqa: BLE001
                    with lock:
                        errors.append(f"{user.tenant} {user.salt}: {e}")
                    return
                # What could have been cached for it: any prompt of its
                # namespace sent before it ended (clients run concurrently,
                # so one picked later may have run first), none of others.
                with lock:
                    allowed = max((common_prefix(prompt, q)
                                   for i, q in enumerate(seen[ns])
                                   if i != mine), default=0)
                    other = max((common_prefix(prompt, q)
                                 for k, qs in seen.items() if k != ns
                                 for q in qs), default=0)
                allowed = min(allowed, len(prompt) - 1)
                if user.tenant[2]:  # shared scope: whole blocks only
                    allowed = allowed // BLOCK * BLOCK
                cached = usage.cached_prompt_tokens
                split = usage.kv.cached_tokens_by_tier
                problems = []
                if out != ref[tuple(prompt)]:
                    problems.append(f"output {out} != {ref[tuple(prompt)]}")
                if cached > allowed:
                    problems.append(f"cached {cached} > {allowed} its own "
                                    f"namespace {ns} could give")
                if split.device + split.disk + split.remote != cached:
                    problems.append(f"split {split} != {cached}")
                with lock:
                    errors.extend(problems)
                    stats["cached"] += cached
                    stats["tier_tokens"] += split.disk + split.remote
                    if other > max(allowed, BLOCK):
                        stats["opportunities"] += 1

        threads = [threading.Thread(target=client) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup))
