#!/usr/bin/env python3
"""End to end on --device cuda through the real kvserve binary: concurrent
greedy requests over gRPC give the same tokens with and without preemption
by swap (KV blocks copied out of device memory to pinned host memory and
back through the CUDA backend), /metrics counts the swaps, and no KV block
is left in use; with bf16, fp8 and int8 KV pages (int8: the block count of
`kvserve plan`, the dtype in every report, an unalignable block size
refused).

Runs where the binary has CUDA and sees a device: a GPU, or the build on the
SIMT emulator (KVSERVE_CUDA_EMU; CI's sanitizer stage runs it there).
Elsewhere it exits 77 (ctest: skipped), as without grpcio.

    cuda_device_e2e_test.py --binary build/server/kvserve --source-dir .
"""

import os
import re
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, RedisServer,  # noqa: E402
                             counter, free_port,
                             run_concurrently, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
BLOCK = 16
# SmolLM2-135M on the GPU: 30 layers x 3 KV heads x 64 x (K, V) x bf16.
BLOCK_BYTES = 30 * 3 * 64 * 2 * 2 * BLOCK
# int8 (q8_0) pages: one byte per value plus an fp16 scale per 32 values,
# 17/32 of bf16's bytes: 1.88 times the blocks for the same budget.
INT8_BLOCK_BYTES = BLOCK_BYTES * 17 // 32
PROMPT, NEW = 40, 24  # 4 blocks per request
NO_DEVICE = ("no CUDA device is visible", "has no CUDA support")


class Server(KvserveProcess):
    def __init__(self, *extra, kv_bytes=str(64 * BLOCK_BYTES),
                 prefix_caching=False):
        super().__init__(ARGS.binary, ARGS.source_dir, "--device", "cuda",
                         "--kv-cache-bytes", kv_bytes, "--max-model-len",
                         "128", "--max-num-batched-tokens", "128",
                         *(() if prefix_caching else ("--no-prefix-caching",)),
                         *extra, timeout=900)
        import grpc
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        self.stub = PB_GRPC.KvServeStub(self.channel)

    def close(self):
        self.channel.close()
        self.kill()

    def generate(self, ids, logprobs=0):
        """Greedy tokens; with logprobs > 0, (tokens, top-1 token of each
        step's logprobs)."""
        sampling = PB.SamplingParams(temperature=0, max_tokens=NEW,
                                     ignore_eos=True, logprobs=logprobs)
        req = PB.GenerateRequest(prompt_token_ids=PB.TokenIds(ids=ids),
                                 sampling=sampling)
        out, top = [], []
        for msg in self.stub.Generate(req, timeout=900):
            out.extend(msg.token_ids)
            top.extend(lp.top[0].token for lp in msg.logprobs)
        return (out, top) if logprobs else out

    def generate_all(self, prompts):
        return run_concurrently(self.generate, prompts)

    def generate_usage(self, ids, new=4):
        """(greedy tokens, usage) of one request."""
        sampling = PB.SamplingParams(temperature=0, max_tokens=new,
                                     ignore_eos=True)
        req = PB.GenerateRequest(prompt_token_ids=PB.TokenIds(ids=ids),
                                 sampling=sampling)
        out, usage = [], None
        for msg in self.stub.Generate(req, timeout=900):
            out.extend(msg.token_ids)
            if msg.HasField("usage"):
                usage = msg.usage
        return out, usage

    def stop(self):
        self.channel.close()
        return self.terminate(timeout=300)


class CudaDeviceTest(unittest.TestCase):
    def check_swap_keeps_outputs(self, prompts, reference, kv_bytes, *extra):
        """With 10 blocks (the 4 requests need 16 at the end) some requests
        are swapped out and back; their greedy tokens equal `reference`.
        Returns the final scrape, once no block is in use."""
        server = Server(*extra, "--preemption-mode", "swap",
                        "--swap-space-bytes", "32MiB", kv_bytes=kv_bytes)
        try:
            got = server.generate_all(prompts)
            m = server.wait_metrics(lambda m: counter(
                m, "kvserve_kv_blocks", state="active") == 0)
        finally:
            server.close()
        self.assertEqual(got, reference)
        self.assertGreater(counter(m, "kvserve_preemptions_total",
                                   mode="swap", reason="no_free_block"), 0)
        self.assertGreater(counter(m, "kvserve_swap_bytes_total",
                                   direction="in"), 0)
        # Every block swapped out came back.
        self.assertEqual(counter(m, "kvserve_swap_bytes_total",
                                 direction="out"),
                         counter(m, "kvserve_swap_bytes_total",
                                 direction="in"))
        self.assertEqual(counter(m, "kvserve_kv_blocks", state="active"), 0)
        return m

    def test_swap_preemption_keeps_greedy_outputs(self):
        prompts = [token_ids(300 + i, PROMPT) for i in range(4)]
        ref = Server()
        try:
            reference = ref.generate_all(prompts)
            self.assertIn("on cuda:0", ref.text())
            # Plain greedy takes its tokens from the device argmax (the
            # logits rows stay on the GPU); asking for logprobs brings every
            # row to the host and samples there: the same tokens (each run
            # alone, so the GEMM shapes, and so the logits, are the same).
            alone = ref.generate(prompts[0])
            full, top = ref.generate(prompts[0], logprobs=1)
        finally:
            ref.close()
        for tokens in reference:
            self.assertEqual(len(tokens), NEW)
        self.assertEqual(full, alone)
        self.assertEqual(top, alone)
        self.check_swap_keeps_outputs(prompts, reference,
                                      str(10 * BLOCK_BYTES))

    def test_fp8_kv_pages_hold_twice_the_blocks_and_swap(self):
        """--kv-cache-dtype fp8: e4m3 pages, half the bytes of bf16, so the
        same budget holds twice the blocks; greedy outputs survive swap
        preemption as with bf16."""
        prompts = [token_ids(400 + i, PROMPT) for i in range(4)]
        blocks = re.compile(r"kv cache on cuda:0: (\d+) bytes/token \((\w+)\), "
                            r"(\d+) blocks")
        ref = Server("--kv-cache-dtype", "fp8")
        try:
            reference = ref.generate_all(prompts)
            per_token, dtype, num_blocks = ref.wait_for(blocks, 10).groups()
        finally:
            ref.close()
        self.assertEqual(dtype, "fp8")
        self.assertEqual(int(per_token), BLOCK_BYTES // BLOCK // 2)
        self.assertEqual(int(num_blocks), 2 * 64)
        for tokens in reference:
            self.assertEqual(len(tokens), NEW)
        self.check_swap_keeps_outputs(prompts, reference,
                                      str(10 * BLOCK_BYTES // 2),
                                      "--kv-cache-dtype", "fp8")


    def test_int8_kv_pages_hold_1_88x_the_blocks_and_swap(self):
        """--kv-cache-dtype int8: the same budget holds budget // int8 block
        bytes blocks (120 for bf16's 64), the count `kvserve plan` gives;
        the start log, GetModelInfo, /v1/models and the cache gauge say
        int8; greedy outputs survive swap preemption as with bf16."""
        import json
        import subprocess
        import urllib.request
        prompts = [token_ids(500 + i, PROMPT) for i in range(4)]
        blocks = re.compile(r"kv cache on cuda:0: (\d+) bytes/token \((\w+)\), "
                            r"(\d+) blocks")
        budget = 64 * BLOCK_BYTES
        ref = Server("--kv-cache-dtype", "int8", kv_bytes=str(budget))
        try:
            reference = ref.generate_all(prompts)
            per_token, dtype, num_blocks = ref.wait_for(blocks, 10).groups()
            info = ref.stub.GetModelInfo(PB.GetModelInfoRequest(), timeout=30)
            url = f"http://127.0.0.1:{ref.http_port}/v1/models"
            with urllib.request.urlopen(url, timeout=30) as r:
                models = json.loads(r.read())["data"][0]["kvserve"]
            gauge = [k for k in ref.metrics()
                     if k.startswith("kvserve_cache_config_info")]
        finally:
            ref.close()
        self.assertEqual(dtype, "int8")
        self.assertEqual(int(per_token), INT8_BLOCK_BYTES // BLOCK)
        self.assertEqual(int(num_blocks), budget // INT8_BLOCK_BYTES)
        self.assertEqual(int(num_blocks), 120)  # 1.875 x bf16's 64
        self.assertEqual(info.kv_dtype, "int8")
        self.assertEqual(info.num_blocks, int(num_blocks))
        self.assertEqual(models["kv_cache_dtype"], "int8")
        self.assertEqual(len(gauge), 1)
        self.assertIn('kv_dtype="int8"', gauge[0])
        plan = subprocess.run(
            [ARGS.binary, "plan", "--model", "smollm2-135m", "--kv-dtype",
             "int8", "--memory", str(budget), "--json"],
            capture_output=True, text=True, timeout=60, cwd=ARGS.source_dir)
        self.assertEqual(plan.returncode, 0, plan.stderr)
        self.assertEqual(
            json.loads(plan.stdout)["concurrency"]["budget_blocks"],
            int(num_blocks))
        for tokens in reference:
            self.assertEqual(len(tokens), NEW)
        self.check_swap_keeps_outputs(prompts, reference,
                                      str(10 * INT8_BLOCK_BYTES),
                                      "--kv-cache-dtype", "int8")

    def test_host_cache_and_lower_tiers_under_the_device_pool(self):
        """--kv-host-cache-bytes: a prompt's blocks evicted from a small
        device pool come back from pinned host slots (copied on the side
        stream, which the emulator defers: a load used before its copy
        finished would read stale bytes); the disk and Redis tiers stage
        through the host cache, so after a restart the prompt is a disk hit,
        and on a daemon with an empty disk a remote hit. Every hit gives the
        greedy tokens of a pool hit, and the usage splits the cached tokens
        by tier. The first daemon's KV events announce the host cache's
        blocks as CPU and the disk's as STORAGE, as many as each holds."""
        import json
        import shutil
        import tempfile
        import urllib.request
        import llmd_kv_index
        if shutil.which("redis-server") is None:
            self.fail("redis-server is missing: deploy/setup.sh --test")
        prompt = token_ids(600, 64)  # 4 full blocks
        floods = [token_ids(610 + i, 64) for i in range(3)]
        tmp = tempfile.mkdtemp(prefix="kvserve-cuda-tiers-")
        redis = RedisServer(tmp)
        host = ("--kv-host-cache-bytes", str(64 * BLOCK_BYTES),
                *redis.flags())
        flags = (*host, "--kv-disk-cache", os.path.join(tmp, "kv"))
        events = f"tcp://127.0.0.1:{free_port()}"
        replay = f"tcp://127.0.0.1:{free_port()}"
        index = llmd_kv_index.KvIndex(BLOCK)
        # Binds, as the router does; a gap is replayed. Read all along, as a
        # router reads (an unread socket drops what exceeds its queue).
        sub = llmd_kv_index.Subscriber(index, events, replay)
        lock = threading.Lock()
        following = [True]

        def follow():
            while following[0]:
                if sub.sub.poll(50):
                    with lock:
                        sub.poll(0)
        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        server = Server(*flags, "--kv-events-endpoint", events,
                        "--kv-events-replay-endpoint", replay,
                        "--kv-events-topic", "kv@gpu-pod@smollm2",
                        "--kv-events-heartbeat-ms", "100",
                        kv_bytes=str(12 * BLOCK_BYTES), prefix_caching=True)
        try:
            self.assertIn("64 host cache slots", server.text())
            cold, usage = server.generate_usage(prompt)
            self.assertEqual(usage.cached_prompt_tokens, 0)
            pool_hit, usage = server.generate_usage(prompt)
            cached = usage.cached_prompt_tokens
            self.assertGreaterEqual(cached, 48)
            self.assertEqual(usage.kv.cached_tokens_by_tier.device, cached)
            self.assertEqual(pool_hit, cold)
            for f in floods:  # 15 blocks through a 12-block pool
                server.generate_usage(f)
            host_hit, usage = server.generate_usage(prompt)
            split = usage.kv.cached_tokens_by_tier
            self.assertEqual(usage.cached_prompt_tokens, cached)
            self.assertGreaterEqual(split.host, 48, str(usage))
            self.assertEqual(split.host + split.device, cached)
            self.assertEqual(host_hit, pool_hit)
            # 16 full blocks computed (4 per prompt), each written to the
            # host, then from there to the disk.
            m = server.wait_metrics(lambda m: counter(
                m, "kvserve_kv_tier_stores_total", tier="disk") >= 16 and
                counter(m, "kvserve_kv_tier_stores_total", tier="remote") >=
                16, timeout=120)
            self.assertEqual(counter(m, "kvserve_kv_blocks", state="active"),
                             0)
            self.assertGreaterEqual(
                counter(m, "kvserve_kv_tier_hits_blocks_total", tier="host"), 3)
            self.assertGreaterEqual(
                counter(m, "kvserve_kv_tier_stores_total", tier="host"), 16)
            held = {t: int(counter(m, "kvserve_kv_tier_blocks", tier=t))
                    for t in ("host", "disk")}

            def announced():
                with lock:
                    return {t: len(index.engine_hashes("gpu-pod", medium))
                            for t, medium in (("host", "cpu"),
                                              ("disk", "storage"))}
            deadline = time.monotonic() + 60
            while announced() != held and time.monotonic() < deadline:
                time.sleep(0.1)
            self.assertEqual(announced(), held)
            self.assertGreater(held["host"], 0)
            self.assertEqual(server.stop(), 0)
            files = [f for _, _, fs in os.walk(os.path.join(tmp, "kv"))
                     for f in fs]
            self.assertGreaterEqual(len(files), 16)
            server = Server(*flags, kv_bytes=str(12 * BLOCK_BYTES),
                            prefix_caching=True)
            disk_hit, usage = server.generate_usage(prompt)
            split = usage.kv.cached_tokens_by_tier
            self.assertEqual(usage.cached_prompt_tokens, cached)
            self.assertEqual(split.disk, cached, str(usage))
            self.assertEqual(disk_hit, pool_hit)
            m = server.wait_metrics(lambda m: counter(
                m, "kvserve_kv_blocks", state="active") == 0)
            self.assertGreaterEqual(
                counter(m, "kvserve_kv_tier_hits_blocks_total", tier="disk"), 3)
            # A daemon with an empty disk: a remote hit through host slots,
            # which the disk then gets too.
            self.assertEqual(server.stop(), 0)
            server = Server(*host, "--kv-disk-cache",
                            os.path.join(tmp, "kv2"),
                            kv_bytes=str(12 * BLOCK_BYTES),
                            prefix_caching=True)
            remote_hit, usage = server.generate_usage(prompt)
            split = usage.kv.cached_tokens_by_tier
            self.assertEqual(split.remote, cached, str(usage))
            self.assertEqual(remote_hit, pool_hit)
            m = server.wait_metrics(lambda m: counter(
                m, "kvserve_kv_tier_stores_total", tier="disk") >= 3)
            self.assertGreaterEqual(
                counter(m, "kvserve_kv_tier_stores_total", tier="disk"), 3)
            # The admin purge reaches the host cache (on the engine thread).
            req = urllib.request.Request(
                f"http://127.0.0.1:{server.http_port}/v1/kv/purge",
                data=json.dumps({"all": True}).encode(), method="POST",
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                purged = json.loads(r.read())["purged"]
            self.assertGreaterEqual(purged["host"], 4, purged)
            self.assertGreaterEqual(purged["disk"], 3, purged)
            self.assertGreaterEqual(purged["remote"], 16, purged)
            m = server.wait_metrics(lambda m: counter(
                m, "kvserve_kv_tier_blocks", tier="host") == 0)
            self.assertEqual(counter(m, "kvserve_kv_tier_blocks", tier="host"),
                             0)
        finally:
            server.close()
            following[0] = False
            follower.join()
            sub.close()
            redis.stop()

    def test_int8_refuses_a_block_size_it_cannot_align(self):
        """int8 blocks must start 16-byte aligned: --block-size 2 (2 x 3 x
        64 values) is refused at start with a message naming the flag."""
        import subprocess
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        out = subprocess.run(
            [ARGS.binary, "--model", model, "--device", "cuda", "--port", "0",
             "--metrics-port", "0", "--kv-cache-dtype", "int8",
             "--block-size", "2", "--max-model-len", "128",
             "--max-num-batched-tokens", "128"],
            capture_output=True, text=True, timeout=600)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("--kv-cache-dtype int8", out.stdout + out.stderr)
        self.assertIn("multiple of 4", out.stdout + out.stderr)


def _setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


def _device_missing(args):
    """The binary's own answer to --device cuda (stopped once the model
    loads for the device): why it refuses, else None."""
    import subprocess
    model = os.path.join(args.source_dir, "weights",
                         "SmolLM2-135M-Instruct.Q4_1.gguf")
    proc = subprocess.Popen(
        [args.binary, "--model", model, "--device", "cuda", "--port", "0",
         "--http-port", "0", "--max-model-len", "128",
         "--max-num-batched-tokens", "128"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    text = ""
    for line in iter(proc.stdout.readline, b""):
        text += line.decode("utf-8", "replace")
        # The device check comes before the model loads.
        if any(s in text for s in NO_DEVICE) or "loaded for cuda" in text:
            break
    proc.kill()
    proc.wait()
    proc.stdout.close()
    missing = next((s for s in NO_DEVICE if s in text), None)
    return f"kvserve --device cuda: {missing}" if missing else None


def main():
    return run_unittests(__doc__, _setup, skip_reason=_device_missing)


if __name__ == "__main__":
    sys.exit(main())
