#!/usr/bin/env python3
"""End-to-end tests of KV sharing through the real kvserve binary:
prefix caching saves prefill and keeps greedy outputs, cache_salt isolates
tenants, preemption by swap and by recompute keeps greedy outputs, and n > 1
completions equal separate requests with derived seeds while holding fewer
KV blocks.

    kv_features_e2e_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import json
import os
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             run_concurrently, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
BLOCK = 16
# SmolLM2-135M: 30 layers x 3 KV heads x 64 x (K, V) x fp16 per token (the
# servers below pin --kv-cache-dtype fp16, so block counts are exact).
BLOCK_BYTES = 30 * 3 * 64 * 2 * 2 * BLOCK


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

    def generate(self, ids, max_tokens, salt="", n=0, seed=None, temp=0.0):
        """Per completion index: (tokens, finish_reason); and the usage."""
        sampling = PB.SamplingParams(temperature=temp, max_tokens=max_tokens,
                                     ignore_eos=True)
        if seed is not None:
            sampling.seed = seed
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=ids), sampling=sampling,
            cache_salt=salt, n=n)
        out, usage, self.texts = {}, None, {}
        for msg in self.stub.Generate(req, timeout=300):
            out.setdefault(msg.index, []).extend(msg.token_ids)
            self.texts[msg.index] = self.texts.get(msg.index, "") + msg.text
            if msg.HasField("usage"):
                usage = msg.usage
        return out, usage

    def generate_all(self, prompts, max_tokens, **kw):
        """Runs the prompts concurrently; index 0's tokens of each."""
        return run_concurrently(
            lambda ids: self.generate(ids, max_tokens, **kw)[0][0], prompts)


class KvFeaturesTest(unittest.TestCase):
    def test_prefix_caching_saves_prefill_and_keeps_outputs(self):
        system = token_ids(1, 1000)
        prompts = [system + token_ids(100 + i, 8) for i in range(50)]
        server = Server()
        try:
            # The first request fills the cache; the rest run together.
            first = server.generate(prompts[0], 2)[0][0]
            on = [first] + server.generate_all(prompts[1:], 2)
            computed_on = counter(server.metrics(),
                                  "kvserve_prompt_tokens_computed_total")
            self.check_salts(server)
        finally:
            server.close()
        # Without caching every prompt token is computed: checked on a
        # subset (the cost is linear in requests), which also gives the
        # reference outputs for it.
        subset = 8
        server = Server("--no-prefix-caching")
        try:
            off = server.generate_all(prompts[:subset], 2)
            computed_subset = counter(server.metrics(),
                                      "kvserve_prompt_tokens_computed_total")
        finally:
            server.close()
        self.assertEqual(on[:subset], off)
        self.assertEqual(computed_subset, subset * 1008)
        computed_off = 50 * 1008
        self.assertLessEqual(computed_on, 0.1 * computed_off,
                             f"computed prefill tokens: on {computed_on}, "
                             f"off {computed_off}")

    def check_salts(self, server):
        prompt = token_ids(7, 200)
        hits = lambda: counter(server.metrics(),  # noqa: E731
                               "kvserve_prefix_cache_hits_tokens_total")
        _, usage_a = server.generate(prompt, 1, salt="tenant-a")
        before = hits()
        _, usage_b = server.generate(prompt, 1, salt="tenant-b")
        self.assertEqual(usage_b.cached_prompt_tokens, 0)
        self.assertEqual(hits(), before)
        tails = counter(server.metrics(),
                        "kvserve_prefix_cache_tail_hits_total")
        _, usage_a2 = server.generate(prompt, 1, salt="tenant-a")
        self.assertEqual(counter(server.metrics(),
                                 "kvserve_prefix_cache_tail_hits_total"),
                         tails + 1)
        # 12 full blocks and 7 of the cached partial 13th: every prompt
        # token but the last, which is always computed.
        self.assertEqual(usage_a2.cached_prompt_tokens, 199)

    def test_preemption_by_swap_and_recompute_keeps_greedy_outputs(self):
        prompts = [token_ids(200 + i, 40) for i in range(8)]
        ref_server = Server("--no-prefix-caching")
        try:
            reference = ref_server.generate_all(prompts, 40)
        finally:
            ref_server.close()
        # 24 blocks; 8 requests of 80 tokens need 40.
        tiny = ["--no-prefix-caching", "--swap-space-bytes", "64MiB"]
        for mode in ("swap", "recompute"):
            server = Server(*tiny, "--preemption-mode", mode,
                            kv_bytes=str(24 * BLOCK_BYTES))
            try:
                got = server.generate_all(prompts, 40)
                m = server.metrics()
            finally:
                server.close()
            self.assertEqual(got, reference, mode)
            self.assertGreater(
                counter(m, "kvserve_preemptions_total", mode=mode,
                        reason="no_free_block"), 0, mode)
            if mode == "swap":
                self.assertGreater(counter(m, "kvserve_swap_bytes_total",
                                           direction="out"), 0)
                self.assertGreater(counter(m, "kvserve_swap_bytes_total",
                                           direction="in"), 0)
            else:
                self.assertGreater(counter(
                    m, "kvserve_preemption_recomputed_tokens_total"), 0)

    def test_int2_key_groups_come_back_from_swap_rebuilt_and_counted(self):
        # int2 quantizes a key group again as it fills, from exact keys the
        # model stages; a sequence swapped out and back lost them, so its
        # partly filled group is rebuilt from its codes: counted. 16 int2
        # blocks of 32 tokens (the dtype's default block size; 4,320 bytes
        # a token); 8 requests of 80 to 115 tokens need about 28. Prompts of
        # different lengths, so that the sequences swapped out are not all
        # at a key group's first row (which would rebuild nothing).
        prompts = [token_ids(200 + i, 40 + 5 * i) for i in range(8)]
        int2_block = 30 * 3 * 24 * 2 * 32
        server = Server("--no-prefix-caching", "--swap-space-bytes", "64MiB",
                        "--preemption-mode", "swap", "--kv-cache-dtype",
                        "int2", kv_bytes=str(16 * int2_block))
        try:
            got = server.generate_all(prompts, 40)
            m = server.metrics()
        finally:
            server.close()
        self.assertTrue(all(len(g) > 0 for g in got), got)
        swapped_in = counter(m, "kvserve_swap_bytes_total", direction="in")
        rebuilt = counter(m, "kvserve_kv_key_groups_rebuilt_total")
        self.assertGreater(swapped_in, 0)
        self.assertGreater(rebuilt, 0, f"swapped in {swapped_in} bytes")

    def test_n_completions_equal_separate_requests_and_share_blocks(self):
        server = Server("--no-prefix-caching")
        try:
            prompt, max_tokens, seed = token_ids(9, 200), 8, 1234
            outs, usage = server.generate(prompt, max_tokens, n=4, seed=seed,
                                          temp=0.9)
            texts = dict(server.texts)
            peak = counter(server.metrics(), "kvserve_kv_blocks_active_peak")
            self.assertEqual(sorted(outs), [0, 1, 2, 3])
            self.assertEqual(usage.prompt_tokens, 200)
            self.assertEqual(usage.completion_tokens, 4 * max_tokens)
            for i in range(4):
                alone, _ = server.generate(prompt, max_tokens, seed=seed + i,
                                           temp=0.9)
                self.assertEqual(outs[i], alone[0], f"completion {i}")
            separate = 4 * -(-(200 + max_tokens) // BLOCK)
            self.assertLess(peak, separate)
            # OpenAI API: n choices with their indices; completion i is the
            # gRPC completion i (same seed derivation).
            body = json.dumps({"prompt": prompt, "max_tokens": max_tokens,
                               "n": 4, "seed": seed, "temperature": 0.9,
                               "ignore_eos": True}).encode()
            req = urllib.request.Request(
                f"http://127.0.0.1:{server.http_port}/v1/completions",
                data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as resp:
                j = json.loads(resp.read())
            self.assertEqual([c["index"] for c in j["choices"]], [0, 1, 2, 3])
            self.assertEqual(j["usage"]["prompt_tokens"], 200)
            self.assertEqual(j["usage"]["completion_tokens"], 4 * max_tokens)
            for i, c in enumerate(j["choices"]):
                self.assertEqual(c["text"], texts[i], f"choice {i}")
        finally:
            server.close()


def _setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


def main():
    return run_unittests(__doc__, _setup)


if __name__ == "__main__":
    sys.exit(main())
