#!/usr/bin/env python3
"""End-to-end tests of the KV remote tier (Redis/Valkey) through the real
kvserve binary and a real redis-server started here with a password: a
prompt computed on one replica is a hit on another (equal greedy tokens,
the split by tier in both APIs, metrics, /v1/kv/state); with the disk tier
too, what the remote brings in is written to the disk; the store going
down and coming back mid-run never fails a request; a corrupted value is a
counted miss; sealed values (--kv-tier-encryption-key-file) hold no
readable token; an admin purge; no password, a password on the command
line and a wrong password are refused or reported.

    kv_remote_tier_e2e_test.py --binary build/server/kvserve --source-dir .

Cost: about 20 s (eleven daemon starts of the default model).
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, RedisServer,  # noqa: E402
                             counter, metric_sum, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
PROMPT = token_ids(39, 300)  # 18 full blocks before its last token
CACHED = 288
PASSWORD = RedisServer.PASSWORD


class Server(KvserveProcess):
    def __init__(self, redis, pwfile, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", "64MiB", "--max-model-len",
                         "1024", *redis.flags(), *extra)
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def close(self):
        self.channel.close()
        self.kill()

    def generate(self, ids, max_tokens=6):
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids),
            sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                       ignore_eos=True))
        tokens, usage = [], None
        for msg in self.stub.Generate(req, timeout=120):
            tokens.extend(msg.token_ids)
            if msg.HasField("usage"):
                usage = msg.usage
        return tokens, usage

    def complete(self, ids, max_tokens=6, **extra):
        body = json.dumps({"prompt": ids, "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True,
                           "logprobs": 1, **extra}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/completions", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            out = json.loads(resp.read())
        return out["choices"][0]["logprobs"]["tokens"], out["usage"]

    def purge(self, body):
        """(HTTP status, JSON answer) of POST /v1/kv/purge."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/kv/purge",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def state(self):
        url = f"http://127.0.0.1:{self.http_port}/v1/kv/state"
        with urllib.request.urlopen(url, timeout=30) as resp:
            return json.loads(resp.read())

    def wait_stored(self, blocks):
        return self.wait_metrics(lambda m: counter(
            m, "kvserve_kv_tier_stores_total", tier="remote") >= blocks)


class RemoteTierTest(unittest.TestCase):
    def setUp(self):
        if shutil.which("redis-server") is None:
            self.fail("redis-server is missing: deploy/setup.sh --test")
        self.tmp = tempfile.mkdtemp(prefix="kvserve_remote_")
        self.redis = RedisServer(self.tmp)
        self.pwfile = self.redis.pwfile

    def tearDown(self):
        self.redis.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_a_prompt_computed_on_one_replica_hits_on_another(self):
        a = Server(self.redis, self.pwfile)
        b = Server(self.redis, self.pwfile)
        try:
            reference, usage = a.generate(PROMPT)
            self.assertEqual(usage.cached_prompt_tokens, 0)
            a.wait_stored(18)
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.cached_prompt_tokens, CACHED)
            split = usage.kv.cached_tokens_by_tier
            self.assertEqual((split.device, split.disk, split.remote),
                             (0, 0, CACHED))
            # Over HTTP: a prompt sharing 12 blocks with it, on replica B.
            second = PROMPT[:200] + token_ids(40, 100)
            other, _ = a.complete(second)
            a.wait_stored(18 + 6)
            tokens2, u = b.complete(second)
            self.assertEqual(tokens2, other)
            by_tier = u["kvserve"]["cached_tokens_by_tier"]
            self.assertEqual(u["prompt_tokens_details"]["cached_tokens"],
                             CACHED)
            self.assertEqual(by_tier["device"], 12 * 16)
            self.assertEqual(by_tier["remote"], CACHED - 12 * 16)
            m = b.metrics()
            self.assertEqual(counter(m, "kvserve_kv_tier_hits_blocks_total",
                                     tier="remote"), 18 + 6)
            self.assertEqual(counter(m, "kvserve_kv_tier_healthy",
                                     tier="remote"), 1)
            # B stored nothing: the store had every block already.
            self.assertEqual(counter(m, "kvserve_kv_tier_stores_total",
                                     tier="remote"), 0)
            tiers = b.state()["tiers"]
            self.assertEqual(tiers[0]["name"], "remote")
            self.assertTrue(tiers[0]["healthy"])
            # Every block A stored (the prompts' and the decode's full
            # ones) is one key.
            keys = self.redis.cli("--scan", "--pattern", "kvserve:v1:*")
            stored = counter(a.metrics(), "kvserve_kv_tier_stores_total",
                             tier="remote")
            self.assertGreaterEqual(stored, 24)
            self.assertEqual(len(keys.split()), stored)
        finally:
            a.close()
            b.close()

    def test_remote_hits_are_written_to_the_disk(self):
        a = Server(self.redis, self.pwfile)
        disk = os.path.join(self.tmp, "kv")
        try:
            reference, _ = a.generate(PROMPT)
            a.wait_stored(18)
        finally:
            a.close()
        b = Server(self.redis, self.pwfile, "--kv-disk-cache", disk)
        try:
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.kv.cached_tokens_by_tier.remote, CACHED)
            b.wait_metrics(lambda m: counter(
                m, "kvserve_kv_tier_stores_total", tier="disk") >= 18)
        finally:
            b.close()
        # Without the store, the disk serves it.
        self.redis.stop()
        c = Server(self.redis, self.pwfile, "--kv-disk-cache", disk)
        try:
            tokens, usage = c.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.kv.cached_tokens_by_tier.disk, CACHED)
        finally:
            c.close()

    def test_the_store_going_down_and_back_never_fails_a_request(self):
        a = Server(self.redis, self.pwfile)
        try:
            reference, _ = a.generate(PROMPT)
            a.wait_stored(18)
            self.redis.stop()
            # Down: every request is served, computed, and counted.
            for seed in (50, 51):
                out, usage = a.generate(token_ids(seed, 300))
                self.assertEqual(len(out), 6)
            again, _ = a.generate(PROMPT)
            self.assertEqual(again, reference)
            m = a.wait_metrics(lambda m: counter(
                m, "kvserve_kv_tier_healthy", tier="remote") == 0)
            self.assertGreaterEqual(counter(
                m, "kvserve_kv_tier_errors_total", tier="remote"), 1)
            self.assertEqual(a.text().count("kv remote tier"), 2)  # open+down
            # Back, empty: stores resume and a later replica hits.
            self.redis.start()
            before = counter(a.metrics(), "kvserve_kv_tier_stores_total",
                             tier="remote")
            deadline = time.monotonic() + 30
            seed = 52
            while time.monotonic() < deadline:
                seed += 1  # a new prompt each time: new blocks to store
                a.generate(token_ids(seed, 300))
                m = a.metrics()
                if counter(m, "kvserve_kv_tier_stores_total",
                           tier="remote") >= before + 18:
                    break
                time.sleep(0.2)
            self.assertEqual(counter(m, "kvserve_kv_tier_healthy",
                                     tier="remote"), 1)
            self.assertGreaterEqual(counter(
                m, "kvserve_kv_tier_stores_total", tier="remote"), before + 18)
        finally:
            a.close()

    def test_a_corrupt_value_is_a_counted_miss(self):
        a = Server(self.redis, self.pwfile)
        try:
            reference, _ = a.generate(PROMPT)
            a.wait_stored(18)
        finally:
            a.close()
        keys = sorted(self.redis.cli("--scan", "--pattern",
                                     "kvserve:v1:*").split())
        for k in keys:  # one byte of every payload
            self.redis.cli("SETRANGE", k, "5000", "Z")
        b = Server(self.redis, self.pwfile)
        try:
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.cached_prompt_tokens, 0)
            m = b.metrics()
            self.assertGreaterEqual(metric_sum(
                m, "kvserve_kv_tier_misses_total", tier="remote",
                reason="checksum"), 1)
            self.assertEqual(counter(m, "kvserve_kv_tier_hits_blocks_total",
                                     tier="remote"), 0)
        finally:
            b.close()

    def test_admin_purge_deletes_a_salts_blocks_from_every_tier(self):
        disk = os.path.join(self.tmp, "kv")
        a = Server(self.redis, self.pwfile, "--kv-disk-cache", disk)
        try:
            a.complete(PROMPT, cache_salt="s1")
            a.complete(token_ids(41, 300), cache_salt="s2")
            m = a.wait_metrics(lambda m: counter(
                m, "kvserve_kv_tier_stores_total", tier="remote") >= 36 and
                counter(m, "kvserve_kv_tier_stores_total", tier="disk") >= 36)
            # The replies' blocks may still be on their way to the store:
            # counted once the count holds still for a second.
            stored = counter(m, "kvserve_kv_tier_stores_total", tier="remote")
            while True:
                time.sleep(1.0)
                now = counter(a.metrics(), "kvserve_kv_tier_stores_total",
                              tier="remote")
                if now == stored:
                    break
                stored = now
            code, out = a.purge({"cache_scope": "", "cache_salt": "s1"})
            self.assertEqual(code, 200, out)
            n1 = out["purged"]["remote"]
            self.assertGreaterEqual(n1, 18)
            self.assertEqual(out["purged"]["disk"], n1)
            # The pool's unreferenced blocks of the salt go too: 19 full
            # blocks and the tail of prompt and reply, not the other salt's.
            self.assertEqual(out["purged"]["host"], 0)
            self.assertTrue(18 <= out["purged"]["device"] <= 20, out)
            keys = self.redis.cli("--scan", "--pattern", "kvserve:v1:*")
            self.assertEqual(len(keys.split()), stored - n1)
            code, out = a.purge({"all": True})
            self.assertEqual(code, 200, out)
            self.assertEqual(out["purged"]["remote"], stored - n1)
            self.assertEqual(self.redis.cli("--scan", "--pattern",
                                            "kvserve:v1:*").split(), [])
            self.assertTrue(18 <= out["purged"]["device"] <= 20, out)
            # Purged everywhere: the prompt is computed again.
            _, usage = a.complete(PROMPT, cache_salt="s1")
            self.assertEqual(usage["prompt_tokens_details"]["cached_tokens"],
                             0, usage)
            for bad, field in (({"all": True, "tenant": "x"}, "exactly one"),
                               ({"all": True, "cache_salt": "s"},
                                "cache_salt"),
                               ({"tenant": 3}, "tenant: must be a string"),
                               ({"bogus": 1}, "bogus: unknown field")):
                code, out = a.purge(bad)
                self.assertEqual(code, 400, bad)
                self.assertIn(field, out["error"]["message"])
        finally:
            a.close()

    def test_sealed_values_hold_no_readable_prompt(self):
        key = os.path.join(self.tmp, "key")
        with open(key, "w") as f:
            f.write("c3" * 32 + "\n")
        os.chmod(key, 0o600)
        sealed = ("--kv-tier-encryption-key-file", key)
        a = Server(self.redis, self.pwfile, *sealed)
        b = Server(self.redis, self.pwfile, *sealed)
        try:
            reference, _ = a.generate(PROMPT)
            a.wait_stored(18)
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.kv.cached_tokens_by_tier.remote, CACHED)
        finally:
            a.close()
            b.close()
        keys = self.redis.cli("--scan", "--pattern", "kvserve:v1:*").split()
        self.assertGreaterEqual(len(keys), 18)
        needles = [struct.pack("<4i", *PROMPT[i:i + 4])
                   for i in range(0, CACHED, 16)]
        for k in keys:
            raw = subprocess.run(
                ["redis-cli", "-p", str(self.redis.port), "--no-auth-warning",
                 "-a", PASSWORD, "--raw", "GET", k], capture_output=True,
                timeout=30).stdout
            self.assertGreater(len(raw), 4096)
            for n in needles:
                self.assertNotIn(n, raw)

    def run_refused(self, *extra, env=None):
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        proc = subprocess.run(
            [ARGS.binary, "--model", model, "--port", "0", "--metrics-port",
             "0", *extra], capture_output=True, text=True, timeout=120,
            env=env)
        self.assertNotEqual(proc.returncode, 0)
        return proc.stdout + proc.stderr

    def test_credentials_stay_off_the_command_line(self):
        env = {k: v for k, v in os.environ.items()
               if k != "KVSERVE_REDIS_PASSWORD"}
        url = f"redis://127.0.0.1:{self.redis.port}"
        self.assertIn("needs a password",
                      self.run_refused("--kv-remote-cache", url, env=env))
        self.assertIn("credentials do not belong in the URL", self.run_refused(
            "--kv-remote-cache", f"redis://:{PASSWORD}@127.0.0.1:1", env=env))
        # A wrong password: the daemon serves, the tier says why it is down.
        env["KVSERVE_REDIS_PASSWORD"] = "wrong"
        a = KvserveProcess(ARGS.binary, ARGS.source_dir, "--threads", "2",
                           "--kv-cache-bytes", "64MiB", "--kv-remote-cache",
                           url, env=env)
        try:
            self.assertIn("WRONGPASS", a.text())
            m = a.metrics()
            self.assertEqual(counter(m, "kvserve_kv_tier_healthy",
                                     tier="remote"), 0)
        finally:
            a.kill()


def setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup))
