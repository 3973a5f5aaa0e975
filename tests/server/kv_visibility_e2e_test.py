#!/usr/bin/env python3
"""End-to-end tests of KV visibility through the real kvserve binary:
per-request KV accounting (gRPC Usage.kv, OpenAI usage.kvserve) agrees with
the metrics; token slots, evictions (by reason, with age and reuse
histograms) and preemptions by mode and reason obey their identities; GET
/v1/kv/state matches its OpenAPI schema and the pool, stays small for a big
pool, and needs the token like /v1/*.

    kv_visibility_e2e_test.py --binary build/server/kvserve --source-dir .
"""

import json
import os
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             metric_sum, run_concurrently, run_unittests,
                             token_ids)

ARGS = None
PB = None
PB_GRPC = None
BLOCK = 16
# SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K, V) x fp16 per token.
BLOCK_BYTES = 30 * 3 * 64 * 2 * 2 * BLOCK
PREEMPT = "kvserve_preemptions_total"


class Server(KvserveProcess):
    def __init__(self, *extra, kv_bytes="256MiB"):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", kv_bytes, "--max-model-len",
                         "2048", "--kv-cache-dtype", "fp16", *extra)
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def close(self):
        self.channel.close()
        self.kill()

    def generate(self, ids, max_tokens, priority=0, on_token=None):
        """(tokens, final usage) of one greedy ignore-EOS request."""
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids), priority=priority,
            sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                       ignore_eos=True))
        tokens, usage = [], None
        for msg in self.stub.Generate(req, timeout=300):
            tokens.extend(msg.token_ids)
            if on_token is not None and msg.token_ids:
                on_token(len(tokens))
            if msg.HasField("usage"):
                usage = msg.usage
        return tokens, usage

    def get(self, path, token=None):
        """(status, body bytes) of GET path."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def kv_state(self):
        status, body = self.get("/v1/kv/state")
        if status != 200:
            raise AssertionError(f"/v1/kv/state: {status} {body[:200]}")
        return json.loads(body)

    def post(self, path, payload):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}",
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.read()


def idle(m):
    return counter(m, "kvserve_kv_blocks", state="active") == 0


class KvVisibilityTest(unittest.TestCase):
    def check_slots(self, m):
        slots = [counter(m, "kvserve_kv_token_slots", state=s) for s in
                 ("active_written", "active_unwritten", "cached", "free")]
        self.assertEqual(sum(slots),
                         counter(m, "kvserve_kv_token_slots_capacity"))
        self.assertEqual(slots[0] + slots[1],
                         counter(m, "kvserve_kv_blocks", state="active") *
                         BLOCK)

    def test_preemption_accounting_equals_the_metrics(self):
        # 24 blocks; 8 requests of 80 tokens need 40: preemptions.
        prompts = [token_ids(300 + i, 40) for i in range(8)]
        for mode in ("swap", "recompute"):
            server = Server("--no-prefix-caching", "--swap-space-bytes",
                            "64MiB", "--preemption-mode", mode,
                            kv_bytes=str(24 * BLOCK_BYTES))
            try:
                results = run_concurrently(
                    lambda ids: server.generate(ids, 40), prompts)
                m = server.wait_metrics(idle)
            finally:
                server.close()
            kv = [usage.kv for _, usage in results]
            for k in kv:
                self.assertEqual(k.kv_dtype, "fp16")
                # 40 prompt + 40 output tokens: 5 blocks at the end.
                self.assertEqual(k.peak_blocks, 5, mode)
                self.assertEqual(k.peak_bytes, 5 * BLOCK_BYTES)
                self.assertGreaterEqual(k.queued_seconds, 0)
                if k.preemptions_recompute + k.preemptions_swap > 0:
                    self.assertGreater(k.preempted_seconds, 0)
                else:
                    self.assertEqual(k.preempted_seconds, 0)
            swaps = sum(k.preemptions_swap for k in kv)
            recomputes = sum(k.preemptions_recompute for k in kv)
            self.assertGreater(swaps if mode == "swap" else recomputes, 0)
            self.assertEqual(swaps, metric_sum(m, PREEMPT, mode="swap"))
            self.assertEqual(recomputes,
                             metric_sum(m, PREEMPT, mode="recompute"))
            self.assertEqual(metric_sum(m, PREEMPT, reason="priority"), 0)
            self.assertEqual(sum(k.recomputed_tokens for k in kv), counter(
                m, "kvserve_preemption_recomputed_tokens_total"))
            self.assertEqual(sum(k.swapped_out_bytes for k in kv), counter(
                m, "kvserve_swap_bytes_total", direction="out"))
            self.assertEqual(sum(k.swapped_in_bytes for k in kv), counter(
                m, "kvserve_swap_bytes_total", direction="in"))
            self.check_slots(m)

    def test_openai_usage_carries_the_kv_extension(self):
        server = Server()
        try:
            prompt = token_ids(5, 40)
            body = json.loads(server.post("/v1/completions", {
                "prompt": prompt, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True}))
            kv = body["usage"]["kvserve"]
            self.assertEqual(kv["kv_dtype"], "fp16")
            self.assertEqual(kv["peak_kv_blocks"], 3)  # 48 tokens
            self.assertEqual(kv["peak_kv_bytes"], 3 * BLOCK_BYTES)
            self.assertEqual(kv["preemptions"], {"recompute": 0, "swap": 0})
            # Streamed: the usage chunk carries it too; n = 2 sums peaks.
            raw = server.post("/v1/completions", {
                "prompt": prompt, "max_tokens": 8, "temperature": 0,
                "ignore_eos": True, "n": 2, "stream": True,
                "stream_options": {"include_usage": True}}).decode()
            chunks = [json.loads(line[6:]) for line in raw.splitlines()
                      if line.startswith("data: {")]
            usage = [c["usage"] for c in chunks if c.get("usage")]
            self.assertEqual(len(usage), 1)
            self.assertEqual(usage[0]["kvserve"]["peak_kv_blocks"], 6)
        finally:
            server.close()

    def test_evictions_by_reason_with_age_and_reuses(self):
        # 24 blocks; A fills 13, its repeat hits 12 cached ones, then B and
        # C (19 blocks each) must evict them.
        server = Server(kv_bytes=str(24 * BLOCK_BYTES))
        try:
            a = token_ids(11, 200)
            server.generate(a, 1)
            _, usage = server.generate(a, 1)
            self.assertEqual(usage.cached_prompt_tokens, 199)
            time.sleep(0.2)  # the cached blocks age measurably
            for seed in (12, 13):
                server.generate(token_ids(seed, 300), 1)
            m = server.wait_metrics(idle)
        finally:
            server.close()
        evictions = metric_sum(m, "kvserve_kv_evictions_total")
        self.assertGreater(
            counter(m, "kvserve_kv_evictions_total", reason="admit"), 0)
        self.assertEqual(counter(m, "kvserve_kv_evicted_block_age_seconds_"
                                 "count"), evictions)
        self.assertEqual(counter(m, "kvserve_kv_evicted_block_reuses_count"),
                         evictions)
        self.assertGreater(counter(m, "kvserve_kv_evicted_block_reuses_sum"),
                           0)
        self.assertGreater(counter(m, "kvserve_kv_evicted_block_age_seconds_"
                                   "sum"), 0.2)
        self.check_slots(m)

    def test_priority_preemption_is_counted_by_reason(self):
        # 24 blocks: the low-priority request holds 18 or more, the urgent
        # one needs 10 and preempts it. By swap, the preempting step runs
        # nothing but the swap-out; the victim's greedy tokens must come out
        # as they do by recompute. Each step takes at least 25 ms, so the
        # low request's 60 tokens last 1.5 s: the urgent one arrives while
        # it runs even when the client is slow to send it (a busy machine).
        # No aging: by default 0.1 s of waiting is worth a level, so an
        # urgent request sent a second after the low one no longer outranks
        # it; on a 2-vCPU AVX2 VM the low one's first token took 0.75 s
        # alone and more under load, and the test failed most runs.
        low_tokens = {}
        for mode in ("recompute", "swap"):
            server = Server("--scheduling-policy", "priority",
                            "--priority-aging-seconds", "0",
                            "--no-prefix-caching", "--preemption-mode", mode,
                            "--swap-space-bytes", "64MiB",
                            "--fault-step-delay-ms", "25",
                            kv_bytes=str(24 * BLOCK_BYTES))
            try:
                started = threading.Event()
                low = {}

                def run_low():
                    low["r"] = server.generate(
                        token_ids(21, 280), 60, priority=10,
                        on_token=lambda n: started.set())
                t = threading.Thread(target=run_low)
                t.start()
                self.assertTrue(started.wait(60))
                _, high = server.generate(token_ids(22, 150), 8, priority=0)
                t.join(120)
                m = server.wait_metrics(idle)
            finally:
                server.close()
            self.assertEqual(high.kv.preemptions_recompute +
                             high.kv.preemptions_swap, 0)
            kv = low["r"][1].kv
            got = kv.preemptions_swap if mode == "swap" else \
                kv.preemptions_recompute
            self.assertGreaterEqual(got, 1, mode)
            # Preempted in a step that ran nothing else: its time preempted
            # still counts.
            self.assertGreater(kv.preempted_seconds, 0, mode)
            self.assertEqual(len(low["r"][0]), 60)
            self.assertEqual(counter(m, PREEMPT, mode=mode, reason="priority"),
                             got, mode)
            if mode == "swap":
                self.assertEqual(kv.swapped_out_bytes, kv.swapped_in_bytes)
                self.assertGreater(kv.swapped_out_bytes, 0)
            low_tokens[mode] = low["r"][0]
        self.assertEqual(low_tokens["swap"], low_tokens["recompute"])

    def test_kv_state_matches_schema_and_pool(self):
        import jsonschema
        with open(os.path.join(ARGS.source_dir, "server", "openapi",
                               "openapi.json")) as f:
            spec = json.load(f)
        schema = dict(spec["components"]["schemas"]["KvState"])
        schema["$defs"] = spec["components"]["schemas"]
        schema = json.loads(json.dumps(schema).replace(
            "#/components/schemas/", "#/$defs/"))
        # Slowed steps: the request runs for seconds, several snapshots long.
        server = Server("--fault-step-delay-ms", "20",
                        kv_bytes=str(40 * BLOCK_BYTES))
        try:
            seen = []

            def watch(n):
                if n >= 5 and not seen:
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        st = server.kv_state()
                        if st["requests"]["running"]:
                            seen.append(st)
                            return
                        time.sleep(0.05)
            server.generate(token_ids(31, 100), 120, on_token=watch)
            self.assertTrue(seen, "no snapshot showed the running request")
            st = seen[0]
            jsonschema.validate(st, schema)
            running = st["requests"]["running"][0]
            self.assertEqual(running["state"], "running")
            self.assertEqual(running["prompt_tokens"], 100)
            self.assertGreaterEqual(running["blocks"], 7)
            self.check_state_identities(st, 40)
            self.assertGreaterEqual(st["blocks"]["active"], running["blocks"])
            # Once idle: nothing active, the request's blocks cached.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                st = server.kv_state()
                if st["blocks"]["active"] == 0 and st["counters"]["finished"]:
                    break
                time.sleep(0.1)
            jsonschema.validate(st, schema)
            self.assertEqual(st["blocks"]["active"], 0)
            self.assertGreater(st["blocks"]["cached"], 0)
            self.assertEqual(st["requests"]["running"], [])
            self.check_state_identities(st, 40)
        finally:
            server.close()
        # A big pool is aggregated: at most 4096 cells, a small body.
        server = Server(kv_bytes="8GiB")
        try:
            status, body = server.get("/v1/kv/state")
            self.assertEqual(status, 200)
            st = json.loads(body)
            jsonschema.validate(st, schema)
            self.assertGreater(st["num_blocks"], 20000)
            self.assertLessEqual(st["grid"]["cells"], 4096)
            self.assertGreater(st["grid"]["cells"], 2048)
            self.assertGreater(st["grid"]["blocks_per_cell"], 1)
            self.assertLess(len(body), 64 * 1024)
            self.check_state_identities(st, st["num_blocks"])
        finally:
            server.close()

    def check_state_identities(self, st, num_blocks):
        self.assertEqual(st["num_blocks"], num_blocks)
        b = st["blocks"]
        self.assertEqual(b["active"] + b["cached"] + b["free"], num_blocks)
        ts = st["token_slots"]
        self.assertEqual(ts["capacity"], num_blocks * BLOCK)
        self.assertEqual(sum(ts[k] for k in ("active_written",
                                             "active_unwritten", "cached",
                                             "free")), ts["capacity"])
        self.assertEqual(ts["active_written"] + ts["active_unwritten"],
                         b["active"] * BLOCK)
        g = st["grid"]
        for k in ("active", "cached", "free"):
            self.assertEqual(sum(g[k]), b[k], k)
            self.assertEqual(len(g[k]), g["cells"])
        self.assertEqual(g["cells"], -(-num_blocks // g["blocks_per_cell"]))

    def test_kv_state_needs_the_token_and_ui_does_not(self):
        with tempfile.NamedTemporaryFile("w", suffix=".tokens") as f:
            f.write("s3cret-token\n")
            f.flush()
            server = Server("--auth-token-file", f.name)
            try:
                status, _ = server.get("/v1/kv/state")
                self.assertEqual(status, 401)
                status, _ = server.get("/v1/kv/state", token="wrong")
                self.assertEqual(status, 401)
                status, body = server.get("/v1/kv/state",
                                          token="s3cret-token")
                self.assertEqual(status, 200)
                self.assertEqual(json.loads(body)["object"],
                                 "kvserve.kv_state")
                status, body = server.get("/ui")
                self.assertEqual(status, 200)
                self.assertIn(b"/v1/kv/state", body)
            finally:
                server.close()


def _setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


def main():
    return run_unittests(__doc__, _setup)


if __name__ == "__main__":
    sys.exit(main())
