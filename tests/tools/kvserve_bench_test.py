#!/usr/bin/env python3
"""Tests tools/kvserve_bench.py against the real kvserve daemon.

Starts kvserve on free ports with a small KV cache, runs the bench with
--json, and checks the counts (exact lengths via ignore_eos), throughput,
ordered percentiles and the /metrics figures; also that non-loopback
targets are refused and that the synthetic workloads are seeded and exact.

    kvserve_bench_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio, grpcio-tools or numpy is missing.
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import unittest

ARGS = None
LISTENING = re.compile(rb"kvserve: listening grpc=(\S+):(\d+) http=(\S+):(\d+)")


def bench_path():
    return os.path.join(ARGS.source_dir, "tools", "kvserve_bench.py")


def run_bench(*args, timeout=120):
    return subprocess.run([sys.executable, bench_path(), *args],
                          capture_output=True, text=True, timeout=timeout)


class BenchTest(unittest.TestCase):
    proc = None

    @classmethod
    def setUpClass(cls):
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            raise RuntimeError(f"{model} missing (run deploy/setup.sh)")
        cls.proc = subprocess.Popen(
            [ARGS.binary, "--model", model, "--port", "0", "--metrics-port",
             "0", "--max-model-len", "512", "--kv-cache-bytes", "32MiB"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        cls.log = []
        match = None
        for line in iter(cls.proc.stdout.readline, b""):
            cls.log.append(line)
            match = LISTENING.search(line)
            if match:
                break
        if match is None:
            cls.proc.kill()
            cls.proc.wait()
            raise RuntimeError("kvserve did not start:\n" +
                               b"".join(cls.log).decode("utf-8", "replace"))
        # Keep draining the output so the server never blocks on the pipe.
        cls.drain = threading.Thread(
            target=lambda: [cls.log.append(x) for x in
                            iter(cls.proc.stdout.readline, b"")],
            daemon=True)
        cls.drain.start()
        cls.target = f"127.0.0.1:{int(match.group(2))}"
        cls.metrics = f"http://127.0.0.1:{int(match.group(4))}/metrics"
        cls.http = f"127.0.0.1:{int(match.group(4))}"

    @classmethod
    def tearDownClass(cls):
        if cls.proc.poll() is None:
            cls.proc.kill()
        cls.proc.wait()
        cls.drain.join(timeout=10)
        cls.proc.stdout.close()

    def test_fixed_workload_json(self):
        res = run_bench("--target", self.target, "--metrics-url",
                        self.metrics, "--num-requests", "8", "--concurrency",
                        "4", "--input-len", "32", "--output-len", "8",
                        "--seed", "1", "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)  # one JSON object, nothing else
        self.assertEqual(out["completed"], 8, res.stdout)
        self.assertEqual(out["failed"], 0, res.stdout)
        self.assertEqual(out["errors"], {})
        self.assertEqual(out["finish_reasons"], {"FINISH_REASON_LENGTH": 8})
        self.assertEqual(out["total_output_tokens"], 64)
        self.assertEqual(out["total_input_tokens"], 8 * 32)
        self.assertGreater(out["request_throughput"], 0)
        self.assertGreater(out["output_throughput"], 0)
        self.assertGreater(out["total_token_throughput"],
                           out["output_throughput"])
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            s = out[key]
            self.assertIsNotNone(s, key)
            self.assertGreater(s["p50"], 0, key)
            self.assertLessEqual(s["p50"], s["p90"], key)
            self.assertLessEqual(s["p90"], s["p99"], key)
        self.assertLessEqual(out["ttft_ms"]["p99"], out["e2e_ms"]["p99"])
        self.assertIsInstance(out["preemptions"], int)
        self.assertGreaterEqual(out["preemptions"], 0)
        self.assertIsNotNone(out["peak_kv_usage"])
        self.assertGreater(out["peak_kv_usage"], 0)
        self.assertLessEqual(out["peak_kv_usage"], 1)
        self.assertIn("done", res.stderr)  # the progress line

    def test_sampled_workload(self):
        res = run_bench("--target", self.target, "--metrics-url",
                        self.metrics, "--num-requests", "4", "--concurrency",
                        "4", "--input-len", "16", "--output-len", "6",
                        "--temperature", "1.0", "--top-p", "0.95", "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)
        self.assertEqual(out["completed"], 4, res.stdout)
        self.assertEqual(out["errors"], {})
        self.assertEqual(out["total_output_tokens"], 24)
        self.assertEqual(out["sampling"]["temperature"], 1.0)

    def test_table_output(self):
        res = run_bench("--target", self.target, "--metrics-url",
                        self.metrics, "--num-requests", "2", "--input-len",
                        "8", "--output-len", "2", "--no-progress")
        self.assertEqual(res.returncode, 0, res.stderr)
        for row in ("Successful requests:", "Output token throughput",
                    "P99 TTFT (ms):", "P50 E2E (ms):", "Preemptions:",
                    "Peak KV cache usage:"):
            self.assertIn(row, res.stdout)

    def test_non_loopback_target_is_refused(self):
        for target in ("10.1.2.3:50051", "example.com:50051",
                       "[2001:db8::1]:50051"):
            res = run_bench("--target", target, "--num-requests", "1",
                            timeout=30)
            self.assertEqual(res.returncode, 2, res.stderr)
            self.assertIn("not a loopback address", res.stderr)
        res = run_bench("--target", self.target, "--metrics-url",
                        "http://192.0.2.1:9090/metrics", timeout=30)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("--metrics-url", res.stderr)


    def test_openai_backend_json(self):
        # /metrics is read from the --target HTTP port by default.
        res = run_bench("--backend", "openai", "--target", self.http,
                        "--vocab-size", "49152", "--num-requests", "4",
                        "--concurrency", "2", "--input-len", "16",
                        "--output-len", "6", "--temperature", "0.8",
                        "--top-p", "0.9", "--top-k", "40", "--min-p", "0.02",
                        "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)
        self.assertEqual(out["backend"], "openai")
        self.assertEqual(out["sampling"], {"temperature": 0.8, "top_p": 0.9,
                                           "top_k": 40, "min_p": 0.02})
        self.assertEqual(out["completed"], 4, res.stdout)
        self.assertEqual(out["errors"], {})
        self.assertEqual(out["finish_reasons"], {"length": 4})
        self.assertEqual(out["total_output_tokens"], 24)
        self.assertEqual(out["total_input_tokens"], 4 * 16)
        for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            s = out[key]
            self.assertIsNotNone(s, key)
            self.assertLessEqual(s["p50"], s["p90"], key)
            self.assertLessEqual(s["p90"], s["p99"], key)
        self.assertLessEqual(out["ttft_ms"]["p99"], out["e2e_ms"]["p99"])
        self.assertIsInstance(out["preemptions"], int)
        self.assertIsNotNone(out["peak_kv_usage"])

    def test_openai_backend_reports_http_errors(self):
        res = run_bench("--backend", "openai", "--target", self.http,
                        "--model", "no-such-model", "--num-requests", "2",
                        "--output-len", "2", "--no-metrics", "--json")
        self.assertEqual(res.returncode, 0, res.stderr)
        out = json.loads(res.stdout)
        self.assertEqual(out["completed"], 0)
        self.assertEqual(out["errors"], {"HTTP_404": 2})

    def test_openai_backend_non_loopback_is_refused(self):
        res = run_bench("--backend", "openai", "--target", "192.0.2.7:8000",
                        timeout=30)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("not a loopback address", res.stderr)


class WorkloadTest(unittest.TestCase):
    """The synthetic datasets, without a server."""

    @classmethod
    def setUpClass(cls):
        spec = importlib.util.spec_from_file_location("kvserve_bench",
                                                      bench_path())
        cls.mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cls.mod)

    def work(self, *argv, vocab=1000, max_context=512, seed=3):
        import numpy as np
        args = self.mod.build_parser().parse_args(list(argv))
        self.mod.validate(args)
        return self.mod.make_workload(args, vocab, max_context,
                                      np.random.default_rng(seed))

    def test_seeded_and_within_limits(self):
        for dataset in self.mod.DATASETS:
            argv = ("--dataset", dataset, "--num-requests", "40",
                    "--input-len", "64", "--output-len", "32",
                    "--prefix-len", "100", "--long-input-len", "1000")
            a, b = self.work(*argv), self.work(*argv)
            self.assertEqual(a, b, dataset)
            self.assertNotEqual(a, self.work(*argv, seed=4), dataset)
            for prompt, out in a:
                self.assertGreaterEqual(out, 1)
                self.assertLessEqual(len(prompt) + out, 512, dataset)
                self.assertTrue(all(0 <= t < 1000 for t in prompt), dataset)

    def test_shared_prefix_shares_prefixes(self):
        work = self.work("--dataset", "shared-prefix", "--num-requests", "6",
                         "--num-prefixes", "2", "--prefix-len", "20",
                         "--input-len", "5")
        self.assertTrue(all(len(p) == 25 for p, _ in work))
        self.assertEqual(work[0][0][:20], work[2][0][:20])
        self.assertEqual(work[1][0][:20], work[5][0][:20])
        self.assertNotEqual(work[0][0][:20], work[1][0][:20])
        self.assertNotEqual(work[0][0][20:], work[2][0][20:])

    def test_long_context_mix(self):
        work = self.work("--dataset", "long-context", "--num-requests", "200",
                         "--input-len", "16", "--output-len", "8",
                         "--long-input-len", "400", "--long-fraction", "0.25")
        lengths = {len(p) for p, _ in work}
        self.assertEqual(lengths, {16, 400})
        n_long = sum(len(p) == 400 for p, _ in work)
        self.assertTrue(20 <= n_long <= 80, n_long)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
        import numpy  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (pip install grpcio==1.85.1 grpcio-tools==1.85.1 "
              "numpy)")
        return 77
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
