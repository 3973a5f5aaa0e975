#!/usr/bin/env python3
"""End to end on --device cuda through the real kvserve binary: concurrent
greedy requests over gRPC give the same tokens with and without preemption
by swap (KV blocks copied out of device memory to pinned host memory and
back through the CUDA backend), /metrics counts the swaps, and no KV block
is left in use.

Runs where the binary has CUDA and sees a device: a GPU, or the build on the
SIMT emulator (KVSERVE_CUDA_EMU; CI's sanitizer stage runs it there).
Elsewhere it exits 77 (ctest: skipped), as without grpcio.

    cuda_device_e2e_test.py --binary build/server/kvserve --source-dir .
"""

import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             run_concurrently, run_unittests, token_ids)

ARGS = None
PB = None
PB_GRPC = None
BLOCK = 16
# SmolLM2-135M on the GPU: 30 layers x 3 KV heads x 64 x (K, V) x bf16.
BLOCK_BYTES = 30 * 3 * 64 * 2 * 2 * BLOCK
PROMPT, NEW = 40, 24  # 4 blocks per request
NO_DEVICE = ("no CUDA device is visible", "has no CUDA support")


class Server(KvserveProcess):
    def __init__(self, *extra, kv_bytes=str(64 * BLOCK_BYTES)):
        super().__init__(ARGS.binary, ARGS.source_dir, "--device", "cuda",
                         "--kv-cache-bytes", kv_bytes, "--max-model-len",
                         "128", "--max-num-batched-tokens", "128",
                         "--no-prefix-caching", *extra, timeout=900)
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
