#!/usr/bin/env python3
"""Tests tools/http_stream_loadtest.py against the real kvserve daemon.

The tool spawns kvserve itself (--spawn), opens 16 concurrent SSE streams on
/v1/completions (spread over 2 s) and must report every stream completed, ordered latency
percentiles and the server's threads and RSS; a non-loopback target is
refused.

    http_stream_loadtest_test.py --binary build/server/kvserve --source-dir .
"""

import argparse
import json
import os
import subprocess
import sys
import unittest

ARGS = None


def run_tool(*args, timeout=150):
    return subprocess.run(
        [sys.executable,
         os.path.join(ARGS.source_dir, "tools", "http_stream_loadtest.py"),
         *args], capture_output=True, text=True, timeout=timeout)


class LoadTest(unittest.TestCase):
    def test_streams_against_kvserve(self):
        model = os.path.join(ARGS.source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            self.skipTest(f"{model} missing (run deploy/setup.sh)")
        spawn = (f"{ARGS.binary} --model {model} --port 0 --http-port 0 "
                 "--http-threads 1 --max-model-len 256 "
                 "--kv-cache-bytes 32MiB --max-num-seqs 64")
        # All at once, on one HTTP thread.
        res = run_tool("--spawn", spawn, "--streams", "64",
                       "--max-tokens", "2", "--prompt-len", "4", "--json")
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        out = json.loads(res.stdout)
        self.assertEqual(out["completed"], 64, out)
        self.assertEqual(out["errors"], {})
        t = out["ttft_ms"]
        self.assertLessEqual(t["p50"], t["p90"])
        self.assertLessEqual(t["p90"], t["p99"])
        self.assertLessEqual(t["p99"], out["stream_ms"]["p99"])
        # A stream holds no thread (cpp-httplib needed one per stream).
        self.assertLessEqual(out["server_threads_peak"],
                             out["server_threads_idle"] + 4, out)
        self.assertGreater(out["server_rss_peak_mib"], 0)

    def test_non_loopback_refused(self):
        res = run_tool("--target", "192.0.2.9:8000", "--streams", "1",
                       timeout=30)
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("not a loopback address", res.stderr)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
