#!/usr/bin/env python3
"""End-to-end tests of the KV disk tier through the real kvserve binary:
SIGTERM writes what is queued and the restarted daemon serves the prompt
from disk (exact cached_tokens and their split in both APIs, equal greedy
tokens); kill -9 keeps what was written; two daemons share one directory;
a corrupted file is a counted miss, deleted, never a wrong token; another
KV format never hits; sealed blocks (--kv-tier-encryption-key-file) hold no
readable token and hit only under their key; write faults and an unsafe
directory.

    kv_disk_tier_e2e_test.py --binary build/server/kvserve --source-dir .

Cost: about 30 s (twelve daemon starts of the default model).
"""

import json
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             metric_sum, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
PROMPT = token_ids(39, 300)  # 18 full blocks before its last token
CACHED = 288


class Server(KvserveProcess):
    def __init__(self, disk, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", "64MiB", "--max-model-len",
                         "1024", "--kv-disk-cache", disk,
                         "--kv-disk-cache-bytes", "256MiB", *extra)
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def close(self):
        self.channel.close()
        self.kill()

    def stop(self):
        """SIGTERM and wait for the exit (its drain flushes the tier)."""
        self.channel.close()
        self.assertexit = self.terminate(timeout=60)

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

    def complete(self, ids, max_tokens=6):
        """(token ids, usage) of an OpenAI completion of prompt ids."""
        body = json.dumps({"prompt": ids, "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True,
                           "logprobs": 1}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/completions", data=body,
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            out = json.loads(resp.read())
        return out["choices"][0]["logprobs"]["tokens"], out["usage"]

    def get(self, path):
        url = f"http://127.0.0.1:{self.http_port}{path}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, resp.read()

    def wait_stored(self, blocks):
        m = self.wait_metrics(lambda m: counter(
            m, "kvserve_kv_tier_stores_total", tier="disk") >= blocks)
        return counter(m, "kvserve_kv_tier_stores_total", tier="disk")


def block_files(disk):
    out = []
    for root, _, files in os.walk(disk):
        out.extend(os.path.join(root, f) for f in files
                   if f.endswith(".kvb"))
    return out


class DiskTierTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvserve_disk_")
        self.disk = os.path.join(self.tmp, "kv")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_sigterm_then_restart_serves_the_prompt_from_disk(self):
        a = Server(self.disk)
        try:
            reference, usage = a.generate(PROMPT)
            self.assertEqual(usage.cached_prompt_tokens, 0)
            other, _ = a.generate(PROMPT[:200] + token_ids(40, 100))
        finally:
            a.stop()
        self.assertEqual(a.assertexit, 0)
        self.assertGreaterEqual(len(block_files(self.disk)), 18)
        for f in block_files(self.disk):
            self.assertEqual(stat.S_IMODE(os.stat(f).st_mode), 0o600)
        b = Server(self.disk)
        try:
            self.assertRegex(b.text(), r"kv disk tier .*: [1-9]\d* blocks")
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.cached_prompt_tokens, CACHED)
            split = usage.kv.cached_tokens_by_tier
            self.assertEqual((split.device, split.disk), (0, CACHED))
            # The other prompt over HTTP: its own 18 blocks, from disk.
            second = PROMPT[:200] + token_ids(40, 100)
            _, u = b.complete(second)
            self.assertEqual(u["prompt_tokens_details"]["cached_tokens"],
                             CACHED)
            by_tier = u["kvserve"]["cached_tokens_by_tier"]
            # Its first 12 blocks are the pool's now (shared with PROMPT).
            self.assertEqual(by_tier["device"] + by_tier["disk"], CACHED)
            self.assertEqual(by_tier["disk"], CACHED - 12 * 16)
            self.assertEqual(by_tier["host"] + by_tier["remote"], 0)
            m = b.metrics()
            self.assertEqual(counter(m, "kvserve_kv_tier_hits_blocks_total",
                                     tier="disk"), 18 + 6)
            self.assertEqual(counter(m, "kvserve_kv_tier_loads_total"), 2)
            self.assertGreater(counter(m, "kvserve_kv_tier_blocks",
                                       tier="disk"), 0)
            self.assertIn("kvserve_kv_tier_load_seconds_count", m)
            # Two loads and their lookups, on the engine thread's clock.
            self.assertGreater(
                counter(m, "kvserve_kv_tier_engine_cpu_seconds_total"), 0)
            # Snapshots are rebuilt every ~200 ms while read.
            deadline = time.monotonic() + 10
            while True:
                state = json.loads(b.get("/v1/kv/state")[1])
                if (state["tiers"][0]["hits"] == 24 or
                        time.monotonic() > deadline):
                    break
                time.sleep(0.1)
            self.assertEqual(state["tiers"][0]["name"], "disk")
            self.assertTrue(state["tiers"][0]["healthy"])
            self.assertEqual(state["tiers"][0]["hits"], 24)
        finally:
            b.close()

    def test_kill9_keeps_what_was_written(self):
        a = Server(self.disk)
        try:
            reference, _ = a.generate(PROMPT)
            a.wait_stored(18)
            a.proc.send_signal(signal.SIGKILL)
            a.proc.wait(timeout=30)
        finally:
            a.close()
        b = Server(self.disk)
        try:
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.kv.cached_tokens_by_tier.disk, CACHED)
        finally:
            b.close()

    def test_two_daemons_share_one_directory(self):
        a, b = Server(self.disk), Server(self.disk)
        try:
            reference, _ = a.generate(PROMPT)
            a.wait_stored(18)
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.kv.cached_tokens_by_tier.disk, CACHED)
        finally:
            a.close()
            b.close()

    def test_a_corrupt_block_is_a_counted_miss_and_deleted(self):
        a = Server(self.disk)
        try:
            reference, _ = a.generate(PROMPT)
        finally:
            a.stop()
        files = block_files(self.disk)
        # Flip one payload byte of every file: each load fails its checksum.
        for f in files:
            with open(f, "r+b") as fh:
                fh.seek(4096 + 1000)
                b = fh.read(1)
                fh.seek(4096 + 1000)
                fh.write(bytes([b[0] ^ 0x01]))
        b = Server(self.disk)
        try:
            tokens, usage = b.generate(PROMPT)
            self.assertEqual(tokens, reference)
            self.assertEqual(usage.cached_prompt_tokens, 0)
            # The deleted block is written again from the recompute.
            b.wait_stored(1)
            m = b.metrics()
            self.assertEqual(metric_sum(m, "kvserve_kv_tier_misses_total",
                                        tier="disk", reason="checksum"), 1)
            self.assertEqual(counter(m, "kvserve_kv_tier_hits_blocks_total",
                                     tier="disk"), 0)
        finally:
            b.close()
        self.assertEqual(len(block_files(self.disk)), len(files))

    def test_another_kv_format_never_hits(self):
        a = Server(self.disk, "--kv-cache-dtype", "int8")
        try:
            a.generate(PROMPT)
        finally:
            a.stop()
        b = Server(self.disk, "--kv-cache-dtype", "fp16")
        try:
            _, usage = b.generate(PROMPT)
            self.assertEqual(usage.cached_prompt_tokens, 0)
        finally:
            b.close()

    def test_write_faults_keep_serving(self):
        a = Server(self.disk, "--kv-tier-inject-faults", "enospc")
        try:
            first, _ = a.generate(PROMPT)
            second, _ = a.generate(token_ids(41, 300))
            again, _ = a.generate(PROMPT)
            self.assertEqual(again, first)
            self.assertEqual(len(second), 6)
            m = a.wait_metrics(lambda m: counter(
                m, "kvserve_kv_tier_errors_total", tier="disk") >= 1)
            self.assertEqual(counter(m, "kvserve_kv_tier_healthy",
                                     tier="disk"), 0)
            self.assertGreaterEqual(
                metric_sum(m, "kvserve_kv_tier_stores_dropped_total",
                           tier="disk", reason="error"), 1)
            self.assertEqual(counter(m, "kvserve_kv_tier_stores_total",
                                     tier="disk"), 0)
            self.assertEqual(a.text().count("write failed"), 1)
        finally:
            a.close()

    def test_sealed_blocks_hold_no_readable_prompt(self):
        key1 = os.path.join(self.tmp, "key1")
        key2 = os.path.join(self.tmp, "key2")
        for path, byte in ((key1, "a1"), (key2, "b2")):
            with open(path, "w") as f:
                f.write(byte * 32 + "\n")
            os.chmod(path, 0o600)
        a = Server(self.disk, "--kv-tier-encryption-key-file", key1)
        try:
            reference, _ = a.generate(PROMPT)
            self.assertIn("sealed (aes-256-gcm:", a.text())
        finally:
            a.stop()
        files = block_files(self.disk)
        self.assertGreaterEqual(len(files), 18)
        needles = [struct.pack("<4i", *PROMPT[i:i + 4])
                   for i in range(0, 288, 16)]
        for f in files:
            with open(f, "rb") as fh:
                data = fh.read()
            for n in needles:
                self.assertNotIn(n, data, f)
        # The same key: a hit. Another key, or none: another salt, no hit.
        for key, cached in ((key1, CACHED), (key2, 0), (None, 0)):
            extra = ["--kv-tier-encryption-key-file", key] if key else []
            b = Server(self.disk, *extra)
            try:
                tokens, usage = b.generate(PROMPT)
                self.assertEqual(tokens, reference)
                self.assertEqual(usage.kv.cached_tokens_by_tier.disk, cached,
                                 key)
            finally:
                b.stop()
        # A key file others can read is refused.
        os.chmod(key1, 0o644)
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        proc = subprocess.run(
            [ARGS.binary, "--model", model, "--port", "0", "--metrics-port",
             "0", "--kv-disk-cache", self.disk,
             "--kv-tier-encryption-key-file", key1], capture_output=True,
            text=True, timeout=120)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("chmod 600", proc.stdout + proc.stderr)

    def test_an_unsafe_directory_is_refused(self):
        os.makedirs(self.disk)
        os.chmod(self.disk, 0o777)
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        proc = subprocess.run(
            [ARGS.binary, "--model", model, "--port", "0", "--metrics-port",
             "0", "--kv-disk-cache", self.disk], capture_output=True,
            text=True, timeout=120)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("writable by group or others", proc.stdout + proc.stderr)


def setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup))
