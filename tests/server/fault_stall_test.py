#!/usr/bin/env python3
"""Readiness reflects progress (real kvserve binary).

With the test-only fault injection --fault-step-delay-ms every engine
step takes seconds; with --stall-timeout 1, a pending request makes /ready
answer 503 and grpc.health.v1 report NOT_SERVING (overall and for
kvserve.v1.KvServe), with a log line saying why. The stalled request still
completes, and readiness returns once the engine is idle. An idle engine is
never stalled, however slow its steps.

    fault_stall_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import re
import sys
import threading
import time
import unittest

import fault_util as fu

STEP_DELAY_MS = 3000  # each step; the stall timeout is 1 s
SERVICE = b"kvserve.v1.KvServe"


class StallTest(unittest.TestCase):
    def wait_for(self, pred, timeout=30):
        deadline = time.monotonic() + timeout
        while not pred() and time.monotonic() < deadline:
            time.sleep(0.05)  # poll interval, not synchronization
        return pred()

    def test_stalled_engine_is_not_ready(self):
        server = fu.Server("--stall-timeout", "1", "--kv-cache-bytes",
                           "64MiB", "--max-model-len", "256",
                           "--fault-step-delay-ms", str(STEP_DELAY_MS))
        channel = server.channel()
        try:
            self.assertIn("--fault-step-delay-ms", server.text())
            # Idle: ready, however slow a step would be.
            time.sleep(1.5)  # longer than the stall timeout, with no work
            self.assertEqual(server.http("/ready")[0], 200)
            self.assertEqual(server.grpc_health(channel), fu.SERVING)

            stub = fu.PB_GRPC.KvServeStub(channel)
            result = {}

            def run():
                result["tokens"], result["last"] = fu.run_stream(
                    stub, fu.greedy("Hello", 2))
            t = threading.Thread(target=run)
            t.start()
            self.assertTrue(self.wait_for(
                lambda: server.http("/ready")[0] == 503, 10),
                server.text())
            self.assertEqual(server.grpc_health(channel), fu.NOT_SERVING)
            self.assertEqual(server.grpc_health(channel, SERVICE),
                             fu.NOT_SERVING)
            self.assertEqual(server.http("/health")[0], 200)  # alive
            line = server.wait_for(re.compile(
                r"not ready.*engine stalled: (\d+) running and (\d+) waiting"
                r".*no engine step completed for .*--stall-timeout"), 10)
            self.assertIsNotNone(line, server.text())
            self.assertEqual(int(line.group(1)) + int(line.group(2)), 1)

            t.join(timeout=60)
            self.assertEqual(len(result["tokens"]), 2)  # it still completed
            self.assertTrue(self.wait_for(
                lambda: server.http("/ready")[0] == 200, 10))
            self.assertEqual(server.grpc_health(channel), fu.SERVING)
            self.assertEqual(server.grpc_health(channel, SERVICE), fu.SERVING)
            self.assertIsNotNone(
                server.wait_for(re.compile(r"ready again"), 10))
        finally:
            channel.close()
            server.kill()


if __name__ == "__main__":
    sys.exit(fu.main(__doc__))
