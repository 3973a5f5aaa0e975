#!/usr/bin/env python3
"""--device sim:<gpu>[x<tp>] end to end through the real binary.

`kvserve --model llama3-70b --device sim:h200` with no weights anywhere:
the pool is the block count `kvserve plan --gpu` prints for the same GPU,
ranks, weight bytes and KV dtype (fp8 weights on one H200, bf16 weights on
two, an fp8 KV cache); GetModelInfo, /v1/models and the
kvserve_cache_config_info gauge say the device is simulated; a completion
over HTTP and a Generate over gRPC return exactly max_tokens seeded
pseudo-random tokens (the same request, the same text; --sim-seed changes
it); at --sim-speed 1 a decode step lasts at least the roofline's time for
one sequence (a lower bound only: the host can be slower, never faster).
Configurations that cannot run are refused at start with the reason: bf16
Llama-3-70B on one H200 (no room for KV), an unknown GPU, fp16 KV. A
measured step profile (--sim-profile) sets the pace instead of the
roofline. `kvserve sim-replay` prints its summary as JSON and writes the
per-step CSV; a flag that does not fit the device is a usage error.

    sim_device_e2e_test.py --binary build/server/kvserve --source-dir .
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, run_unittests  # noqa: E402

ARGS = None
PB = None
PB_GRPC = None


def plan(*flags):
    out = subprocess.run(
        [ARGS.binary, "plan", "--model", "llama3-70b", "--json", *flags],
        capture_output=True, text=True, timeout=60, cwd=ARGS.source_dir)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def sim(*flags):
    # --model given twice: the last one wins (the default model's path is
    # KvserveProcess's first).
    return KvserveProcess(ARGS.binary, ARGS.source_dir, "--model",
                          "llama3-70b", *flags)


def post(server, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.http_port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def timed_completion(server, max_tokens):
    """A greedy completion of exactly `max_tokens`; (response, seconds)."""
    t0 = time.monotonic()
    out = post(server, "/v1/completions",
               {"prompt": "hello", "max_tokens": max_tokens,
                "temperature": 0})
    return out, time.monotonic() - t0


class SimDevice(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_pool_matches_the_plan(self):
        cases = [
            (["--device", "sim:h200", "--sim-weight-bytes", "1"],
             ["--gpu", "h200", "--weight-bytes", "1"], "bf16"),
            (["--device", "sim:h200x2"], ["--gpu", "h200", "--tp", "2"],
             "bf16"),
            (["--device", "sim:h100x2", "--kv-cache-dtype", "fp8"],
             ["--gpu", "h100", "--tp", "2", "--kv-dtype", "fp8"], "fp8"),
        ]
        import grpc
        for serve_flags, plan_flags, dtype in cases:
            with self.subTest(serve=serve_flags):
                want = plan(*plan_flags)
                server = sim(*serve_flags)
                try:
                    chan = grpc.insecure_channel(
                        f"127.0.0.1:{server.grpc_port}")
                    info = PB_GRPC.KvServeStub(chan).GetModelInfo(
                        PB.GetModelInfoRequest(), timeout=30)
                    chan.close()
                    self.assertTrue(info.simulated)
                    self.assertEqual(info.device, serve_flags[1])
                    self.assertEqual(info.kv_dtype, dtype)
                    self.assertEqual(info.num_layers, 80)
                    self.assertEqual(info.kv_bytes_per_token,
                                     want["bytes_per_token"])
                    self.assertEqual(info.num_blocks,
                                     want["concurrency"]["budget_blocks"])
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{server.http_port}/v1/models",
                            timeout=30) as r:
                        kv = json.loads(r.read())["data"][0]["kvserve"]
                    self.assertIs(kv["simulated"], True)
                    self.assertEqual(kv["num_blocks"], info.num_blocks)
                    gauge = [k for k in server.metrics()
                             if k.startswith("kvserve_cache_config_info")]
                    self.assertEqual(len(gauge), 1)
                    self.assertIn('simulated="true"', gauge[0])
                    self.assertIn(f'device="{serve_flags[1]}"', gauge[0])
                    self.assertIn("SIMULATED device", server.text())
                finally:
                    server.kill()

    def test_tokens_are_seeded_and_honour_max_tokens(self):
        body = {"model": "llama3-70b", "prompt": "The capital of France is",
                "max_tokens": 12, "temperature": 0}
        texts = []
        for seed in ("0", "0", "5"):
            server = sim("--device", "sim:h200", "--sim-weight-bytes", "1",
                         "--sim-speed", "0", "--sim-seed", seed)
            try:
                out = post(server, "/v1/completions", body)
                self.assertEqual(out["usage"]["completion_tokens"], 12)
                self.assertEqual(out["choices"][0]["finish_reason"], "length")
                texts.append(out["choices"][0]["text"])
                # Sampled too: a peaked distribution, still 12 tokens.
                sampled = post(server, "/v1/completions",
                               dict(body, temperature=0.8, seed=3))
                self.assertEqual(sampled["usage"]["completion_tokens"], 12)
                # gRPC with token ids: greedy, then stopped at the third of
                # those tokens by a stop id.
                ids = self.generate(server, max_tokens=6)
                self.assertEqual(len(ids), 6)
                stopped = self.generate(server, max_tokens=6,
                                        stop_token_ids=[ids[2]])
                self.assertEqual(stopped[:2], ids[:2])
                self.assertLessEqual(len(stopped), 3)
            finally:
                server.kill()
        self.assertEqual(texts[0], texts[1])
        self.assertNotEqual(texts[0], texts[2])
        self.assertRegex(texts[0], r"^( t\d+)+$")

    @staticmethod
    def generate(server, **sampling):
        import grpc
        chan = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        ids = []
        req = PB.GenerateRequest(
            prompt_token_ids=PB.TokenIds(ids=[300, 301, 302]),
            sampling=PB.SamplingParams(temperature=0, **sampling))
        for resp in PB_GRPC.KvServeStub(chan).Generate(req, timeout=30):
            ids.extend(resp.token_ids)
        chan.close()
        return ids

    def test_real_time_steps_last_the_roofline_time(self):
        # One sequence's decode step: the 70.55 GB of fp8 weights at the
        # default 0.7 x 4.8 TB/s, 21.0 ms; 48 of them cannot take under 1 s.
        step = plan("--gpu", "h200", "--weight-bytes", "1", "--concurrency",
                    "1", "--context", "64")["roofline"]["decode_step"]
        self.assertGreater(step["seconds"], 0.017)
        server = sim("--device", "sim:h200", "--sim-weight-bytes", "1")
        try:
            out, took = timed_completion(server, 48)
        finally:
            server.kill()
        self.assertEqual(out["usage"]["completion_tokens"], 48)
        self.assertGreaterEqual(took, 47 * step["seconds"])

    def test_a_step_profile_sets_the_pace(self):
        profile = os.path.join(self.tmp, "profile.json")
        with open(profile, "w") as f:
            json.dump({"kind": "kvserve-step-profile", "version": 1,
                       "seconds": {"base": 0.05, "per_token": 0, "per_seq": 0,
                                   "per_attended": 0, "per_kv_read": 0,
                                   "prefill": 0}}, f)
        server = sim("--device", "sim:h200", "--sim-weight-bytes", "1",
                     "--sim-profile", profile)
        try:
            out, took = timed_completion(server, 10)
            self.assertIn("measured step profile", server.text())
        finally:
            server.kill()
        self.assertEqual(out["usage"]["completion_tokens"], 10)
        self.assertGreaterEqual(took, 10 * 0.05)

    def test_sim_replay_command(self):
        csv_path = os.path.join(self.tmp, "replay.csv")
        out = subprocess.run(
            [ARGS.binary, "sim-replay", "--model", "llama3-8b", "--device",
             "sim:h100", "--num-requests", "50", "--request-rate", "20",
             "--input-len", "300", "--output-len", "20", "--num-prefixes",
             "2", "--prefix-len", "128", "--json", "--timeseries", csv_path],
            capture_output=True, text=True, timeout=120, cwd=ARGS.source_dir)
        self.assertEqual(out.returncode, 0, out.stderr)
        r = json.loads(out.stdout)
        self.assertEqual(r["completed"], 50)
        self.assertEqual(r["output_tokens"], 50 * 20)
        self.assertGreater(r["cached_prompt_tokens"], 0)
        self.assertGreater(r["speedup"], 1)
        with open(csv_path) as f:
            lines = f.read().splitlines()
        self.assertTrue(lines[0].startswith("time_s,running,waiting"))
        self.assertEqual(len(lines) - 1, r["steps"])
        bad = subprocess.run(
            [ARGS.binary, "sim-replay", "--device", "sim:h100",
             "--profile-out", csv_path],
            capture_output=True, text=True, timeout=60, cwd=ARGS.source_dir)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--profile-out", bad.stderr)

    def test_impossible_configurations_are_refused(self):
        cases = [
            (["--device", "sim:h200"], "use more ranks (sim:h200x2)"),
            (["--device", "sim:tpu"], "unknown GPU"),
            (["--device", "sim:h200x2", "--kv-cache-dtype", "fp16"],
             "--kv-cache-dtype fp16"),
            (["--device", "cpu", "--sim-profile", "p.json"],
             "--sim-profile: needs --device sim"),
        ]
        for flags, why in cases:
            with self.subTest(flags=flags):
                out = subprocess.run(
                    [ARGS.binary, "--model", "llama3-70b", "--port", "0",
                     "--metrics-port", "0", *flags],
                    capture_output=True, text=True, timeout=60,
                    cwd=ARGS.source_dir)
                self.assertNotEqual(out.returncode, 0)
                err = out.stdout + out.stderr
                self.assertIn(why, err)
                self.assertNotIn("kvserve: listening", err)


def main():
    def setup(args, pb, pb_grpc):
        global ARGS, PB, PB_GRPC
        ARGS, PB, PB_GRPC = args, pb, pb_grpc

    return run_unittests(__doc__, setup)


if __name__ == "__main__":
    sys.exit(main())
