#!/usr/bin/env python3
"""--kv-cache-dtype end to end through the real binary, for every CPU dtype.

For f32, fp16, bf16, int8, int4, int3 and int2: the daemon on a 64 MiB
KV budget
reports the dtype and its bytes per token in GetModelInfo, /v1/models and
the kvserve_cache_config_info gauge; its block count is the one `kvserve
plan --memory 64MiB --kv-dtype D` computes (plan and pool agree to the
block); a greedy completion of "The capital of France is" over HTTP starts
with " Paris" (int4, int3 and int2 answers are only checked to be text;
the low-bit ones generate 40 tokens, past their first 32-token key
group). `kvserve generate` takes the flag too. Combinations that cannot
run are refused at start, naming the flag: fp8 on the CPU, an unknown
name, int2 on blocks that do not hold whole key groups.
--rope-scale 2 doubles the context a request may use.

    kv_dtype_e2e_test.py --binary build/server/kvserve --source-dir .
"""

import json
import os
import re
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, run_unittests  # noqa: E402

ARGS = None
PB = None
PB_GRPC = None
BUDGET = 64 << 20
# SmolLM2-135M: 2 (K, V) x 30 layers x 3 KV heads x one 64-element row.
BYTES_PER_TOKEN = {"f32": 46080, "fp16": 23040, "bf16": 23040,
                   "int8": 12240, "int4": 6480, "int3": 5760, "int2": 4320}


def plan_blocks(dtype):
    out = subprocess.run(
        [ARGS.binary, "plan", "--model", "smollm2-135m", "--kv-dtype", dtype,
         "--memory", str(BUDGET), "--json"],
        capture_output=True, text=True, timeout=60, cwd=ARGS.source_dir)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["bytes_per_token"] == BYTES_PER_TOKEN[dtype], plan
    return plan["concurrency"]["budget_blocks"]


class KvDtypes(unittest.TestCase):
    def test_every_cpu_dtype_end_to_end(self):
        import grpc
        for dtype, per_token in BYTES_PER_TOKEN.items():
            with self.subTest(dtype=dtype):
                server = KvserveProcess(
                    ARGS.binary, ARGS.source_dir, "--kv-cache-dtype", dtype,
                    "--kv-cache-bytes", str(BUDGET), "--swap-space-bytes",
                    "0")
                try:
                    chan = grpc.insecure_channel(
                        f"127.0.0.1:{server.grpc_port}")
                    info = PB_GRPC.KvServeStub(chan).GetModelInfo(
                        PB.GetModelInfoRequest(), timeout=30)
                    self.assertEqual(info.kv_dtype, dtype)
                    self.assertEqual(info.kv_bytes_per_token, per_token)
                    self.assertEqual(info.num_blocks, plan_blocks(dtype))
                    block = 32 if dtype in ("int3", "int2") else 16
                    self.assertEqual(info.num_blocks,
                                     BUDGET // (block * per_token))
                    base = f"http://127.0.0.1:{server.http_port}"
                    with urllib.request.urlopen(base + "/v1/models",
                                                timeout=30) as r:
                        kv = json.loads(r.read())["data"][0]["kvserve"]
                    self.assertEqual(kv["kv_cache_dtype"], dtype)
                    self.assertEqual(kv["num_blocks"], info.num_blocks)
                    gauge = [k for k in server.metrics()
                             if k.startswith("kvserve_cache_config_info")]
                    self.assertEqual(len(gauge), 1)
                    self.assertIn(f'kv_dtype="{dtype}"', gauge[0])
                    req = urllib.request.Request(
                        base + "/v1/completions",
                        data=json.dumps({
                            "prompt": "The capital of France is",
                            "max_tokens": 40 if dtype in ("int3", "int2")
                            else 4,
                            "temperature": 0}).encode(),
                        headers={"Content-Type": "application/json"})
                    with urllib.request.urlopen(req, timeout=60) as r:
                        text = json.loads(r.read())["choices"][0]["text"]
                    if dtype not in ("int4", "int3", "int2"):
                        self.assertTrue(text.startswith(" Paris"), text)
                    else:
                        self.assertTrue(text)
                    chan.close()
                finally:
                    server.kill()

    def test_plan_and_start_log_agree_on_weight_bytes(self):
        gguf = os.path.join(ARGS.source_dir, "weights",
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
        out = subprocess.run(
            [ARGS.binary, "plan", "--model", gguf, "--json"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        by_type = json.loads(out.stdout)["weights"]["bytes_by_type"]
        self.assertEqual(set(by_type), {"F32", "Q4_1", "Q8_0"})
        server = KvserveProcess(ARGS.binary, ARGS.source_dir, "--model", gguf)
        try:
            line = server.wait_for(re.compile(
                r"weights: ([0-9.]+) MiB in the file \(([^)]*) MiB\)"), 60)
        finally:
            server.kill()
        self.assertIsNotNone(line)
        logged = dict(part.split(" ") for part in line.group(2).split(", "))
        self.assertEqual(
            logged, {t: f"{b / 1048576:.1f}" for t, b in by_type.items()})
        self.assertEqual(line.group(1),
                         f"{sum(by_type.values()) / 1048576:.1f}")

    def test_generate_takes_the_flag(self):
        out = subprocess.run(
            [ARGS.binary, "generate", "--model", "smollm2-135m", "--no-chat",
             "--temperature", "0", "--max-tokens", "3", "--kv-cache-dtype",
             "int8", "--prompt", "The capital of France is"],
            capture_output=True, text=True, timeout=120,
            cwd=ARGS.source_dir)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(out.stdout.startswith(" Paris"), out.stdout)

    def test_impossible_dtypes_are_refused_at_start(self):
        cases = [("fp8", "CPU backend stores f32, bf16, fp16, int8, int4, "
                 "int3 or int2", []),
                 ("int5", "unknown KV dtype 'int5'", []),
                 ("int2", "--block-size 16: --kv-cache-dtype int2 quantizes keys",
                  ["--block-size", "16"])]
        for dtype, why, extra in cases:
            with self.subTest(dtype=dtype):
                out = subprocess.run(
                    [ARGS.binary, "--model", "smollm2-135m", "--port", "0",
                     "--metrics-port", "0", "--kv-cache-dtype", dtype,
                     *extra],
                    capture_output=True, text=True, timeout=120,
                    cwd=ARGS.source_dir)
                self.assertNotEqual(out.returncode, 0)
                err = out.stdout + out.stderr
                self.assertIn("--kv-cache-dtype", err)
                self.assertIn(why, err)
                self.assertNotIn("kvserve: listening", err)

    def test_context_longer_than_the_model_is_refused_at_start(self):
        # The default model's max_position_embeddings is 8192: a longer
        # --max-model-len is an error, never silently clamped.
        out = subprocess.run(
            [ARGS.binary, "--model", "smollm2-135m", "--port", "0",
             "--metrics-port", "0", "--max-model-len", "16400"],
            capture_output=True, text=True, timeout=120, cwd=ARGS.source_dir)
        self.assertNotEqual(out.returncode, 0)
        err = out.stdout + out.stderr
        self.assertIn("--max-model-len 16400 exceeds the model's context of "
                      "8192 tokens", err)
        self.assertNotIn("kvserve: listening", err)

    def test_rope_scale_stretches_the_context(self):
        # --rope-scale 2 (linear, as llama.cpp's --rope-scale): the context
        # doubles, so a request needing more than 8,192 tokens is taken;
        # the same request is refused (400) without it.
        def first_chunk(server):
            req = urllib.request.Request(
                f"http://127.0.0.1:{server.http_port}/v1/completions",
                data=json.dumps({
                    "prompt": "The capital of France is", "max_tokens": 12000,
                    "temperature": 0, "stream": True,
                    "ignore_eos": True}).encode(),
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status, r.readline()
            except urllib.error.HTTPError as e:
                return e.code, e.read()

        scaled = KvserveProcess(ARGS.binary, ARGS.source_dir, "--rope-scale",
                                "2", "--max-model-len", "16384",
                                "--kv-cache-bytes", "512MiB")
        try:
            line = scaled.wait_for(re.compile(
                r"context (\d+) \(RoPE linear x2 of 8192\)"), 60)
            self.assertIsNotNone(line)
            self.assertEqual(line.group(1), "16384")
            with urllib.request.urlopen(
                    f"http://127.0.0.1:{scaled.http_port}/v1/models",
                    timeout=30) as r:
                model = json.loads(r.read())["data"][0]
            self.assertEqual(model["max_model_len"], 16384)
            status, body = first_chunk(scaled)
            self.assertEqual(status, 200, body)
            self.assertTrue(body.startswith(b"data: "), body)
        finally:
            scaled.kill()
        plain = KvserveProcess(ARGS.binary, ARGS.source_dir,
                               "--kv-cache-bytes", "512MiB")
        try:
            status, body = first_chunk(plain)
            self.assertEqual(status, 400, body)
            self.assertIn(b"exceeds the model's context of 8192", body)
        finally:
            plain.kill()
        out = subprocess.run(
            [ARGS.binary, "--port", "0", "--metrics-port", "0",
             "--rope-scale", "0.5"],
            capture_output=True, text=True, timeout=60, cwd=ARGS.source_dir)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--rope-scale", out.stderr)


def main():
    def setup(args, pb, pb_grpc):
        global ARGS, PB, PB_GRPC
        ARGS, PB, PB_GRPC = args, pb, pb_grpc

    return run_unittests(__doc__, setup)


if __name__ == "__main__":
    sys.exit(main())
