#!/usr/bin/env python3
"""SIGTERM drain under load, and kill -9 followed by a restart (real
kvserve binary).

Drain: with requests running and queued, SIGTERM makes /ready 503, gRPC
health NOT_SERVING, new gRPC calls UNAVAILABLE and new OpenAI calls 503;
in-flight requests that can finish within --drain-timeout finish in full,
the rest end with UNAVAILABLE naming the drain, and the process exits 0.
Restart: a server killed with SIGKILL while streams are open is restarted
on the same gRPC and HTTP ports and serves the same greedy output.

    fault_drain_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import re
import signal
import sys
import threading
import time
import unittest

import fault_util as fu

# A long stream must not finish within the drain: 1,900 tokens in 4 s would
# be 475 tokens/s for each of 4 streams, several times what a CPU does.
DRAIN_TIMEOUT_S = 4
SHORT, LONG = 16, 1900


class Stream(threading.Thread):
    """One Generate call read to its end on its own thread."""

    def __init__(self, stub, prompt, max_tokens):
        super().__init__(daemon=True)
        self.stub, self.prompt, self.max_tokens = stub, prompt, max_tokens
        self.tokens, self.code, self.details = 0, None, ""
        self.first = threading.Event()
        self.start()

    def run(self):
        import grpc
        try:
            for msg in self.stub.Generate(
                    fu.greedy(self.prompt, self.max_tokens), timeout=120):
                self.tokens += len(msg.token_ids)
                self.first.set()
            self.code = "OK"
        except grpc.RpcError as e:
            self.code, self.details = e.code().name, e.details()
        self.first.set()


class DrainTest(unittest.TestCase):
    def test_sigterm_drain_under_load(self):
        import grpc
        server = fu.Server("--max-num-seqs", "4", "--drain-timeout",
                           str(DRAIN_TIMEOUT_S), "--kv-cache-bytes", "512MiB",
                           "--max-model-len", "2048")
        channel = server.channel()
        try:
            stub = fu.PB_GRPC.KvServeStub(channel)
            short = [Stream(stub, f"Short {i}:", SHORT) for i in range(4)]
            for s in short:
                self.assertTrue(s.first.wait(60))
            # Long ones: 4 queue behind the short ones, 4 more wait.
            long = [Stream(stub, f"Long {i}:", LONG) for i in range(8)]
            # Usually all 8 long ones queue while the short ones run.
            server.wait_metrics(lambda m: m[fu.WAITING] >= 8 or all(
                s.code for s in short))
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            # The daemon's "draining: N running" line comes after it stopped
            # admitting (the signal thread's "Terminated: draining" may not).
            self.assertIsNotNone(server.wait_for(
                re.compile(r"draining: \d+ running"), 10))
            # During the drain.
            with self.assertRaises(grpc.RpcError) as cm:
                fu.run_stream(stub, fu.greedy("Too late", 4), timeout=10)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertIn("draining", cm.exception.details())
            status, body = server.post("/v1/completions",
                                       {"prompt": "Too late", "max_tokens": 4})
            self.assertEqual(status, 503, body)
            self.assertEqual(body["error"]["type"], "service_unavailable")
            self.assertEqual(server.http("/ready")[0], 503)
            self.assertEqual(server.grpc_health(channel), fu.NOT_SERVING)

            self.assertEqual(server.proc.wait(timeout=60), 0, server.text())
            elapsed = time.monotonic() - t0
            for s in short + long:
                s.join(timeout=30)
            print(f"\ndrain: exit 0 after {elapsed:.1f} s; short "
                  f"{[(s.code, s.tokens) for s in short]}; long "
                  f"{[(s.code, s.tokens) for s in long]}", flush=True)
            for s in short:  # finished within the drain timeout
                self.assertEqual((s.code, s.tokens), ("OK", SHORT))
            for s in long:  # too long for it: cancelled, and told why
                self.assertEqual(s.code, "UNAVAILABLE", s.details)
                self.assertIn("drain", s.details)
                self.assertLess(s.tokens, LONG)
            self.assertIn("shut down in", server.text())
        finally:
            channel.close()
            server.kill()

    def test_kill9_then_restart_on_same_ports(self):
        first = fu.Server("--kv-cache-bytes", "64MiB", "--max-model-len",
                          "256")
        ports = (first.grpc_port, first.http_port)
        try:
            channel = first.channel()
            stub = fu.PB_GRPC.KvServeStub(channel)
            reference, _ = fu.run_stream(stub, fu.greedy("Paris is", 12))
            # Open connections at the kill: a gRPC stream and an SSE stream.
            streaming = Stream(stub, "Interrupted", 200)
            self.assertTrue(streaming.first.wait(60))
            sock = fu.sse_request(first.http_port,
                                  {"prompt": "Interrupted", "max_tokens": 200,
                                   "ignore_eos": True})
            first.proc.send_signal(signal.SIGKILL)
            self.assertEqual(first.proc.wait(timeout=30), -signal.SIGKILL)
            streaming.join(timeout=30)
            self.assertEqual(streaming.code, "UNAVAILABLE")
            sock.close()
            channel.close()
        finally:
            first.kill()
        second = fu.Server("--kv-cache-bytes", "64MiB", "--max-model-len",
                           "256", "--port", str(ports[0]), "--metrics-port",
                           str(ports[1]))
        try:
            self.assertEqual((second.grpc_port, second.http_port), ports)
            self.assertEqual(second.http("/ready")[0], 200)
            channel = second.channel()
            stub = fu.PB_GRPC.KvServeStub(channel)
            tokens, _ = fu.run_stream(stub, fu.greedy("Paris is", 12))
            self.assertEqual(tokens, reference)
            status, body = second.post("/v1/completions",
                                       {"prompt": "Paris is", "max_tokens": 4,
                                        "temperature": 0})
            self.assertEqual(status, 200, body)
            channel.close()
        finally:
            second.kill()


if __name__ == "__main__":
    sys.exit(fu.main(__doc__))
