#!/usr/bin/env python3
"""Overload on the OpenAI HTTP API (real kvserve binary).

The HTTP server is asynchronous: a streaming response holds a socket, not a
thread. With ONE I/O thread, many more concurrent streams than threads must
all complete while /health keeps answering promptly. Beyond
--http-max-connections, API calls get 429 at once (naming the flag) while
the probes are still served. Afterwards no KV block is active.

    overload_http_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import sys
import threading
import time
import unittest

import fault_util as fu

STREAMS = 64         # concurrent streams on one I/O thread
CAP = 8              # --http-max-connections in the cap test
CAP_CLIENTS = 24
SECONDS = 12
MAX_TOKENS = 16
# With a thread per stream (cpp-httplib, before): p50 3.4 s, max 12.9 s.
HEALTH_LATENCY_BOUND_S = 5.0
HEALTH_MEDIAN_BOUND_S = 0.25


def call(server, i, n, stream):
    body = {"prompt": f"Client {i} call {n}:", "temperature": 0,
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    t = time.monotonic()
    status, out = server.post("/v1/completions", body, timeout=180)
    return status, stream, out, time.monotonic() - t


class OverloadHttpTest(unittest.TestCase):
    def probe(self, server, stop, health):
        while not stop.is_set():
            t = time.monotonic()
            status = server.http("/health", timeout=30)[0]
            health.append((status, time.monotonic() - t))
            stop.wait(0.1)

    def check_admitted(self, ok):
        for status, stream, out, _ in ok:
            if stream:
                self.assertTrue(out.rstrip().endswith("data: [DONE]"), out)
                self.assertEqual(out.count('"finish_reason":"length"'), 1)
            else:
                self.assertEqual(out["usage"]["completion_tokens"],
                                 MAX_TOKENS)

    def check_health(self, health):
        lat = [h[1] for h in health]
        self.assertTrue(all(h[0] == 200 for h in health), health[:3])
        self.assertGreater(len(health), 3)
        self.assertLess(max(lat), HEALTH_LATENCY_BOUND_S)
        self.assertLess(fu.percentile(lat, .5), HEALTH_MEDIAN_BOUND_S)
        return lat

    def test_streams_hold_no_thread(self):
        server = fu.Server("--http-threads", "1", "--max-num-seqs", "64",
                           "--kv-cache-bytes", "64MiB", "--max-model-len",
                           "256")
        try:
            stop, health, results = threading.Event(), [], []
            prober = threading.Thread(target=self.probe,
                                      args=(server, stop, health))
            prober.start()
            threads = [threading.Thread(
                target=lambda i=i: results.append(
                    call(server, i, 0, i % 4 != 0)))
                for i in range(STREAMS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=300)
            stop.set()
            prober.join()
            m = server.wait_idle()
        finally:
            server.kill()
        self.assertEqual([r[0] for r in results], [200] * STREAMS,
                         [r for r in results if r[0] != 200][:2])
        self.check_admitted(results)
        lat = self.check_health(health)
        print(f"\n{STREAMS} concurrent calls on 1 HTTP thread: all 200; "
              f"/health {len(health)} probes p50 "
              f"{fu.percentile(lat, .5):.3f} s max {max(lat):.3f} s",
              flush=True)
        self.assertEqual(m[fu.ACTIVE], 0)

    def test_connection_cap(self):
        server = fu.Server("--http-max-connections", str(CAP),
                           "--max-num-seqs", "4", "--kv-cache-bytes", "64MiB",
                           "--max-model-len", "256")
        try:
            self.run_cap_load(server)
        finally:
            server.kill()

    def run_cap_load(self, server):
        stop = threading.Event()
        results, health = [], []

        def client(i):
            n = 0
            while not stop.is_set():
                r = call(server, i, n, i % 2 == 1)
                results.append(r)
                n += 1
                if r[0] == 429:
                    stop.wait(0.05)  # back off a little, then press again

        threads = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(CAP_CLIENTS)]
        threads.append(threading.Thread(
            target=self.probe, args=(server, stop, health), daemon=True))
        for t in threads:
            t.start()
        time.sleep(SECONDS)  # the load period (the checks are not timed)
        stop.set()
        for t in threads:
            t.join(timeout=180)
        m = server.wait_idle()

        ok = [r for r in results if r[0] == 200]
        busy = [r for r in results if r[0] == 429]
        lat = self.check_health(health)
        print(f"\n{CAP_CLIENTS} HTTP clients, cap {CAP} connections: "
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
        self.check_admitted(ok)
        for _, _, out, _ in busy:
            self.assertIn("--http-max-connections", out["error"]["message"])
        self.assertEqual(m[fu.ACTIVE], 0)
        self.assertEqual(m[fu.RUNNING], 0)


if __name__ == "__main__":
    sys.exit(fu.main(__doc__))
