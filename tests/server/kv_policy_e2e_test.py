#!/usr/bin/env python3
"""End-to-end tests of kv_policy "streaming" (bounded KV: sinks + window)
through the real kvserve binary, gRPC and HTTP, on the default model:

- a window that covers the whole request changes nothing (bit-identical
  greedy tokens); a smaller one changes nothing until its first drop;
- heavy_hitters holds its budget (bit-identical while it covers the
  request), over HTTP and gRPC;
- one request generates 3x past --max-model-len with a flat number of
  pages, and usage, /v1/kv/state and /metrics say what was dropped; a
  prompt past the model's trained context is served;
- swap preemption and n > 1 forks keep a windowed request's greedy tokens;
- what cannot be honoured is refused naming the field (HTTP 400, gRPC
  INVALID_ARGUMENT), and --kv-policy sets the default (a default that
  cannot be honoured stops the start).

About 40 s on 2 vCPUs (four servers).

    kv_policy_e2e_test.py --binary build/server/kvserve --source-dir .
"""

import json
import os
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             run_concurrently, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
BLOCK = 16
CONTEXT = 256  # --max-model-len of the servers below
# SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K, V) x fp16 per token.
BLOCK_BYTES = 30 * 3 * 64 * 2 * 2 * BLOCK


class Server(KvserveProcess):
    def __init__(self, *extra, kv_bytes="64MiB"):
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", kv_bytes, "--max-model-len",
                         str(CONTEXT), "--kv-cache-dtype", "fp16",
                         "--no-prefix-caching", *extra)
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def close(self):
        self.channel.close()
        self.kill()

    def generate(self, ids, max_tokens, policy=None, n=0):
        """gRPC: per completion index its tokens, and the usage."""
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids), n=n,
            sampling=PB.SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                       ignore_eos=True))
        if policy is not None:
            req.kv_policy.CopyFrom(PB.KvPolicy(**policy))
        out, usage = {}, None
        for msg in self.stub.Generate(req, timeout=300):
            out.setdefault(msg.index, []).extend(msg.token_ids)
            if msg.HasField("usage"):
                usage = msg.usage
        return out, usage

    def http(self, path, body=None):
        """(status, JSON) of a GET, or of a POST of `body`."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}{path}", data,
            {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def complete(self, ids, max_tokens, policy=None):
        body = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True}
        if policy is not None:
            body["kv_policy"] = policy
        status, d = self.http("/v1/completions", body)
        assert status == 200, d
        return d["choices"][0]["token_ids"], d["usage"]


def first_drop_output(prompt_len, sinks, window):
    """Outputs a streaming request computes before its first drop: the
    first happens in the step whose computed tokens reach the sinks' whole
    blocks + one block + window (Scheduler::DropOutOfWindow)."""
    sink_tokens = -(-sinks // BLOCK) * BLOCK
    return sink_tokens + BLOCK + window - prompt_len + 1


class KvPolicyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def test_a_window_changes_nothing_until_its_first_drop(self):
        prompt = token_ids(7, 20)
        full, usage = self.server.complete(prompt, 200)
        self.assertEqual(usage["kvserve"]["dropped_tokens"], 0)
        # A window covering the request: bit-identical, nothing dropped.
        same, usage = self.server.complete(
            prompt, 200, {"type": "streaming", "sinks": 4, "window": 200})
        self.assertEqual(same, full)
        self.assertEqual(usage["kvserve"]["dropped_tokens"], 0)
        # A 64-token window: identical up to its first drop, over gRPC.
        policy = {"type": "streaming", "sinks": 4, "window": 64}
        out, usage = self.server.generate(prompt, 200, policy)
        k = first_drop_output(len(prompt), 4, 64)
        self.assertEqual(out[0][:k], full[:k])
        self.assertEqual(len(out[0]), 200)
        self.assertGreater(usage.kv.dropped_tokens, 0)
        self.assertLess(usage.kv.peak_blocks, -(-(220) // BLOCK))

    def test_generates_three_times_past_the_context_with_flat_pages(self):
        prompt = token_ids(11, 30)
        policy = {"type": "streaming", "sinks": 4, "window": 128}
        before = counter(self.server.metrics(),
                         "kvserve_kv_policy_dropped_blocks_total")
        # Stream it, and read /v1/kv/state while it runs.
        body = {"prompt": prompt, "max_tokens": 3 * CONTEXT, "stream": True,
                "temperature": 0, "ignore_eos": True, "kv_policy": policy,
                "stream_options": {"include_usage": True}}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.server.http_port}/v1/completions",
            json.dumps(body).encode(), {"content-type": "application/json"})
        states, usage, finish = [], None, None
        with urllib.request.urlopen(req, timeout=300) as resp:
            for i, line in enumerate(resp):
                line = line.decode().strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    usage = chunk["usage"]
                for c in chunk.get("choices", []):
                    finish = c.get("finish_reason") or finish
                if i % 100 == 50:
                    states.append(self.server.http("/v1/kv/state")[1])
        self.assertEqual(finish, "length")
        self.assertEqual(usage["completion_tokens"], 3 * CONTEXT)
        kv = usage["kvserve"]
        # Sinks' block + 128 + the block being written: at most 10 blocks,
        # against 50 for the whole request.
        self.assertLessEqual(kv["peak_kv_blocks"], (16 + 128 + 16) // 16 + 1)
        total = len(prompt) + 3 * CONTEXT
        self.assertGreaterEqual(kv["dropped_tokens"], total - 16 - 128 - 16)
        self.assertEqual(kv["dropped_tokens"] % BLOCK, 0)
        after = counter(self.server.metrics(),
                        "kvserve_kv_policy_dropped_blocks_total")
        self.assertEqual((after - before) * BLOCK, kv["dropped_tokens"])
        running = [r for s in states for r in s["requests"]["running"]]
        self.assertTrue(running, states)
        self.assertTrue(any(r["dropped_tokens"] > 0 for r in running))
        for r in running:
            self.assertLessEqual(r["blocks"], 10)

    def test_n_completions_fork_inside_the_window(self):
        prompt = token_ids(13, 150)  # the prompt itself passes the window
        policy = {"type": "streaming", "sinks": 4, "window": 96}
        one, _ = self.server.generate(prompt, 60, policy)
        two, usage = self.server.generate(prompt, 60, policy, n=2)
        self.assertEqual(two[0], one[0])
        self.assertEqual(two[1], one[0])  # greedy: the same tokens
        self.assertGreater(usage.kv.dropped_tokens, 0)

    def test_a_prompt_past_the_trained_context_is_served(self):
        # Every query-key distance stays within the held KV (sinks scored
        # at their in-cache distance), so the model's trained context
        # (8,192) bounds the window, not the request.
        prompt = token_ids(17, 8300)
        policy = {"type": "streaming", "sinks": 4, "window": 128}
        ids, usage = self.server.complete(prompt, 8, policy)
        self.assertEqual(len(ids), 8)
        self.assertEqual(usage["prompt_tokens"], 8300)
        self.assertGreaterEqual(usage["kvserve"]["dropped_tokens"],
                                8300 - 16 - 128 - 2 * BLOCK)
        self.assertLessEqual(usage["kvserve"]["peak_kv_blocks"],
                             CONTEXT // BLOCK)

    def test_heavy_hitters_hold_their_budget(self):
        prompt = token_ids(19, 40)
        full, _ = self.server.complete(prompt, 150)
        # A budget covering the request: bit-identical, nothing dropped.
        roomy = {"type": "heavy_hitters", "sinks": 4, "window": 32,
                 "budget": 224}
        same, usage = self.server.complete(prompt, 150, roomy)
        self.assertEqual(same, full)
        self.assertEqual(usage["kvserve"]["dropped_tokens"], 0)
        # 96 tokens: the sinks' block, the last 32 and the blocks that drew
        # the most attention; over gRPC too.
        policy = {"type": "heavy_hitters", "sinks": 4, "window": 32,
                  "budget": 96}
        ids, usage = self.server.complete(prompt, 150, policy)
        self.assertEqual(len(ids), 150)
        self.assertEqual(ids[:48], full[:48])  # before any drop
        self.assertGreaterEqual(usage["kvserve"]["dropped_tokens"],
                                190 - 96 - BLOCK)
        self.assertLessEqual(usage["kvserve"]["peak_kv_blocks"],
                             96 // BLOCK + 1)
        out, usage = self.server.generate(prompt, 150, policy)
        self.assertEqual(out[0], ids)
        self.assertGreater(usage.kv.dropped_tokens, 0)

    def test_what_cannot_be_honoured_is_refused_naming_the_field(self):
        cases = [
            ({"type": "stream"}, "kv_policy.type"),
            ({"type": "streaming"}, "kv_policy.window"),
            ({"type": "streaming", "window": CONTEXT}, "kv_policy.window"),
            ({"type": "streaming", "sinks": -1, "window": 8},
             "kv_policy.sinks"),
            ({"window": 8}, "kv_policy.type"),
            ({"type": "streaming", "windw": 8}, "kv_policy.windw"),
            ("streaming", "kv_policy"),
            ({"type": "streaming", "window": 64, "budget": 128},
             "kv_policy.budget"),
            ({"type": "heavy_hitters", "window": 64}, "kv_policy.budget"),
            ({"type": "heavy_hitters", "window": 64, "budget": 70},
             "kv_policy.budget"),
            ({"type": "heavy_hitters", "window": 64, "budget": 300},
             "kv_policy.budget"),
        ]
        for policy, field in cases:
            status, d = self.server.http(
                "/v1/completions",
                {"prompt": "hi", "max_tokens": 4, "kv_policy": policy})
            self.assertEqual(status, 400, policy)
            self.assertEqual(d["error"]["param"], field, d)
        # heavy_hitters keeps positions as written: within the trained
        # context (8,192) only.
        status, d = self.server.http(
            "/v1/completions",
            {"prompt": "hi", "max_tokens": 9000,
             "kv_policy": {"type": "heavy_hitters", "window": 64,
                           "budget": 128}})
        self.assertEqual(status, 400)
        self.assertEqual(d["error"]["param"], "max_tokens")
        self.assertIn("trained context", d["error"]["message"])
        import grpc
        with self.assertRaises(grpc.RpcError) as e:
            self.server.generate([1, 2, 3], 4,
                                 {"type": "streaming", "window": 500})
        self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("kv_policy.window", e.exception.details())


class KvPolicyServerTest(unittest.TestCase):
    def test_swap_preemption_keeps_windowed_outputs(self):
        prompts = [token_ids(300 + i, 24) for i in range(4)]
        policy = {"type": "streaming", "sinks": 4, "window": 96}
        server = Server()
        try:
            reference = [server.generate(p, 300, policy)[0][0]
                         for p in prompts]
        finally:
            server.close()
        # 4 windows of 9 blocks in a pool of 20: they preempt each other.
        server = Server("--swap-space-bytes", "64MiB", "--preemption-mode",
                        "swap", kv_bytes=str(20 * BLOCK_BYTES))
        try:
            got = run_concurrently(
                lambda p: server.generate(p, 300, policy)[0][0], prompts)
            m = server.metrics()
        finally:
            server.close()
        self.assertEqual(got, reference)
        self.assertGreater(counter(m, "kvserve_preemptions_total",
                                   mode="swap", reason="no_free_block"), 0)

    def test_the_flag_sets_the_default_policy(self):
        server = Server("--kv-policy", "streaming:sinks=4,window=64")
        try:
            ids, usage = server.complete(token_ids(5, 20), 2 * CONTEXT)
            self.assertEqual(len(ids), 2 * CONTEXT)
            self.assertGreater(usage["kvserve"]["dropped_tokens"], 0)
            # A request may still ask for the full cache.
            status, d = server.http(
                "/v1/completions",
                {"prompt": token_ids(5, 20), "max_tokens": 2 * CONTEXT,
                 "kv_policy": {"type": "full"}})
            self.assertEqual(status, 400)
            self.assertEqual(d["error"]["param"], "max_tokens")
        finally:
            server.close()
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        for policy, why in (("streaming:window=x", "not a number"),
                            ("streaming:window=300", "kv_policy.window")):
            bad = subprocess.run(
                [ARGS.binary, "--model", model, "--port", "0",
                 "--metrics-port", "0", "--max-model-len", str(CONTEXT),
                 "--kv-policy", policy], capture_output=True, text=True,
                timeout=60)
            self.assertNotEqual(bad.returncode, 0, policy)
            self.assertIn("--kv-policy", bad.stdout + bad.stderr)
            self.assertIn(why, bad.stdout + bad.stderr)


def _setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


def main():
    return run_unittests(__doc__, _setup)


if __name__ == "__main__":
    sys.exit(main())
