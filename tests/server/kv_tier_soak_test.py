#!/usr/bin/env python3
"""A soak of the KV cache with the disk and Redis tiers through the real
daemon, its invariants checked after every step (--kv-debug-invariants: a
broken one aborts the daemon and fails every request after it).

Eight clients send prompts built from six shared 256-token system prompts
and twenty user tails (so they repeat), some with n = 2 (copy-on-write
forks), some with a cache_salt, into a pool too small for them (preemption
by swap and by recompute) over a disk tier too small for them (evictions)
and a Redis tier (a redis-server started here), and the daemon is
restarted twice (SIGTERM): once on the same directory, then on an empty
one, so what the pool lacks comes from Redis. Every greedy output of a
prompt equals its first one, before or after a restart, from the pool,
from disk, from Redis or computed. At the end, idle: no KV block held, no
load pending, and each mechanism seen at least once.

    kv_tier_soak_test.py --binary build/server/kvserve --source-dir .

Cost: KVSERVE_SOAK_SECONDS (default 60; up to 100 on a machine slow
enough that a restarted epoch sees no tier hit in its third) plus three
daemon starts; the recorded run is KVSERVE_SOAK_SECONDS=1800.
"""

import os
import random
import shutil
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, RedisServer,  # noqa: E402
                             counter, metric_sum, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
SECONDS = float(os.environ.get("KVSERVE_SOAK_SECONDS", "60"))
SYSTEMS = [token_ids(900 + i, 256) for i in range(6)]
TAILS = [token_ids(950 + i, 16 + 9 * i) for i in range(20)]


class Server(KvserveProcess):
    def __init__(self, disk, redis):
        # int8 KV, 195,840 bytes a block: 85 blocks for eight requests of
        # up to 32; 16 swap slots; 122 block files on disk.
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", "16MiB", "--swap-space-bytes",
                         "3MiB", "--max-model-len", "1024", "--max-num-seqs",
                         "8", "--kv-disk-cache", disk,
                         "--kv-disk-cache-bytes", "24MiB",
                         "--kv-debug-invariants", *redis.flags())
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def generate(self, ids, n, max_tokens, salt):
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids), n=n, cache_salt=salt,
            sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                       ignore_eos=True))
        out = [[] for _ in range(n)]
        usage = None
        for msg in self.stub.Generate(req, timeout=300):
            out[msg.index].extend(msg.token_ids)
            if msg.HasField("usage"):
                usage = msg.usage
        return out, usage

    def stop(self):
        self.channel.close()
        return self.terminate()


class SoakTest(unittest.TestCase):
    def test_soak(self):
        tmp = tempfile.mkdtemp(prefix="kvserve_soak_")
        redis = RedisServer(tmp)
        first = {}          # (prompt key, n, max_tokens, salt) -> outputs
        lock = threading.Lock()
        errors = []
        seen = {"disk_hits": 0, "remote_hits": 0, "requests": 0, "checks": 0}
        try:
            for epoch in range(3):
                # The last epoch on an empty disk: what the pool lacks
                # comes from the Redis tier (and is written to the disk).
                disk = os.path.join(tmp, "kv" if epoch < 2 else "kv2")
                server = Server(disk, redis)
                end = time.monotonic() + SECONDS / 3
                # The restarted epochs go on past `end` (up to twice as
                # long) until a request was served from the tier they
                # exercise: on a slow machine a third of the soak may end
                # before any load found room in the pool.
                want = {1: "disk_hits", 2: "remote_hits"}.get(epoch)
                before = seen[want] if want else 0

                def going(end=end, want=want, before=before):
                    now = time.monotonic()
                    if now < end:
                        return True
                    return (want is not None and seen[want] == before
                            and now < end + 2 * SECONDS / 3)

                try:
                    def client(seed, server=server):
                        rng = random.Random(seed)
                        while going() and not errors:
                            s, t = rng.randrange(6), rng.randrange(20)
                            n = 2 if rng.random() < 0.25 else 1
                            max_tokens = rng.choice((4, 16, 40))
                            salt = "b" if rng.random() < 0.2 else ""
                            key = (s, t)
                            try:
                                out, usage = server.generate(
                                    SYSTEMS[s] + TAILS[t], n, max_tokens,
                                    salt)
                            except Exception as e:  # noqa: BLE001
                                errors.append(f"{key}: {e}")
                                return
                            with lock:
                                seen["requests"] += 1
                                seen["disk_hits"] += (
                                    usage.kv.cached_tokens_by_tier.disk > 0)
                                seen["remote_hits"] += (
                                    usage.kv.cached_tokens_by_tier.remote > 0)
                                # Greedy: every completion, whatever its n,
                                # salt or length, starts as the longest
                                # seen for its prompt.
                                for tokens in out:
                                    ref = first.setdefault(key, tokens)
                                    k = min(len(ref), len(tokens))
                                    if ref[:k] != tokens[:k]:
                                        errors.append(f"{key}: output "
                                                      "changed")
                                    if len(tokens) > len(ref):
                                        first[key] = tokens
                                seen["checks"] += len(out)

                    threads = [threading.Thread(target=client,
                                                args=(epoch * 100 + i,))
                               for i in range(8)]
                    for th in threads:
                        th.start()
                    for th in threads:
                        th.join()
                    self.assertEqual(errors, [])
                    # Idle: nothing held, nothing loading.
                    m = server.wait_metrics(lambda m: counter(
                        m, "kvserve_kv_blocks", state="active") == 0)
                    self.assertEqual(
                        counter(m, "kvserve_kv_blocks", state="active"), 0)
                    self.assertIn("kvserve_kv_tier_loading_requests", m)
                    self.assertEqual(counter(
                        m, "kvserve_kv_tier_loading_requests"), 0)
                    self.assertGreater(metric_sum(
                        m, "kvserve_preemptions_total"), 0)
                    if epoch == 0:
                        self.assertGreater(counter(
                            m, "kvserve_kv_tier_evictions_total",
                            tier="disk"), 0)
                    print(f"epoch {epoch}: " + ", ".join(
                        f"{k.split('{')[0][len('kvserve_'):]}"
                        f"{'{' + k.split('{')[1] if '{' in k else ''}="
                        f"{v:g}" for k, v in sorted(m.items())
                        if k.startswith(("kvserve_kv_tier_loads",
                                         "kvserve_kv_tier_hits",
                                         "kvserve_kv_tier_misses",
                                         "kvserve_preemptions_total"))
                        and v), flush=True)
                finally:
                    code = server.stop()
                self.assertEqual(code, 0, server.text()[-2000:])
            self.assertGreater(seen["disk_hits"], 0)
            self.assertGreater(seen["remote_hits"], 0)
            print(f"soak: {seen['requests']} requests, "
                  f"{seen['disk_hits']} with disk hits, "
                  f"{seen['remote_hits']} with remote hits, "
                  f"{seen['checks']} outputs checked against "
                  f"{len(first)} prompts' first", flush=True)
        finally:
            redis.stop()
            shutil.rmtree(tmp, ignore_errors=True)


def setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup))
