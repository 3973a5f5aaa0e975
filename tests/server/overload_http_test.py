#!/usr/bin/env python3
"""Overload on the OpenAI HTTP API: more concurrent clients than HTTP
worker threads (real kvserve binary).

Each HTTP call holds a worker thread until its response ends; with three
times as many clients as --http-threads (and the engine queue bound far
above it), /health must keep answering promptly because the server keeps
workers for the probes and answers the excess API calls with 429 at once.
Admitted calls (streamed or not) complete in full; afterwards no KV block
is active.

    overload_http_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import sys
import threading
import time
import unittest

import fault_util as fu

HTTP_THREADS = 8
CLIENTS = 3 * HTTP_THREADS
SECONDS = 15
MAX_TOKENS = 16
# Before the fix: p50 3.4 s, max 12.9 s (probes queued behind API calls).
HEALTH_LATENCY_BOUND_S = 5.0
HEALTH_MEDIAN_BOUND_S = 0.25


class OverloadHttpTest(unittest.TestCase):
    def test_more_clients_than_workers(self):
        server = fu.Server("--http-threads", str(HTTP_THREADS),
                           "--max-num-seqs", "4", "--kv-cache-bytes", "64MiB",
                           "--max-model-len", "256")
        try:
            self.run_load(server)
        finally:
            server.kill()

    def run_load(self, server):
        stop = threading.Event()
        results, health = [], []

        def client(i):
            n = 0
            while not stop.is_set():
                body = {"prompt": f"Client {i} call {n}:", "temperature": 0,
                        "max_tokens": MAX_TOKENS, "ignore_eos": True,
                        "stream": i % 2 == 1}
                t = time.monotonic()
                status, out = server.post("/v1/completions", body,
                                          timeout=120)
                results.append((status, body["stream"], out,
                                time.monotonic() - t))
                n += 1
                if status == 429:
                    stop.wait(0.05)  # back off a little, then press again

        def probe():
            while not stop.is_set():
                t = time.monotonic()
                status = server.http("/health", timeout=30)[0]
                health.append((status, time.monotonic() - t))
                stop.wait(0.1)

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(CLIENTS)]
        threads.append(threading.Thread(target=probe, daemon=True))
        for t in threads:
            t.start()
        time.sleep(SECONDS)  # the load period (the checks are not timed)
        stop.set()
        for t in threads:
            t.join(timeout=180)
        m = server.wait_idle()

        ok = [r for r in results if r[0] == 200]
        busy = [r for r in results if r[0] == 429]
        lat = [h[1] for h in health]
        print(f"\n{CLIENTS} HTTP clients, {HTTP_THREADS} workers: "
              f"{len(results) / SECONDS:.1f} calls/s offered, "
              f"{len(ok) / SECONDS:.1f}/s completed, {len(busy)} got 429 "
              f"(p50 {fu.percentile([r[3] for r in busy], .5):.3f} s); "
              f"/health {len(health)} probes p50 "
              f"{fu.percentile(lat, .5):.3f} s max {max(lat):.3f} s",
              flush=True)
        self.assertEqual({r[0] for r in results} - {200, 429}, set(),
                         [r for r in results if r[0] not in (200, 429)][:2])
        self.assertGreater(len(ok), 0)
        self.assertGreater(len(busy), 0)
        for status, stream, out, _ in ok:
            if stream:
                self.assertTrue(out.rstrip().endswith("data: [DONE]"), out)
            else:
                self.assertEqual(out["usage"]["completion_tokens"],
                                 MAX_TOKENS)
        for _, _, out, _ in busy:
            self.assertIn("--http-threads", out["error"]["message"])
        self.assertTrue(all(h[0] == 200 for h in health))
        self.assertGreater(len(health), SECONDS)
        self.assertLess(max(lat), HEALTH_LATENCY_BOUND_S)
        self.assertLess(fu.percentile(lat, .5), HEALTH_MEDIAN_BOUND_S)
        self.assertEqual(m[fu.ACTIVE], 0)
        self.assertEqual(m[fu.RUNNING], 0)


if __name__ == "__main__":
    sys.exit(fu.main(__doc__))
