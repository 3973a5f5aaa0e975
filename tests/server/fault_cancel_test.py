#!/usr/bin/env python3
"""Cancellation storms and vanishing clients (real kvserve binary).

1,000 gRPC streams cancelled at random moments (before the first token,
after a few tokens, after a random delay), then clients that vanish without
cancelling: a client process holding gRPC streams and HTTP SSE streams is
SIGKILLed, and raw SSE sockets are reset (TCP RST). Checks: the server
stays up, no KV block stays active and no request stays queued or running,
every admitted request is accounted as finished, and a control request
running through each storm streams exactly the greedy tokens of a quiet run.

    fault_cancel_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import asyncio
import os
import random
import subprocess
import sys
import textwrap
import threading
import unittest

import fault_util as fu

STORM = 1000
IN_FLIGHT = 32
CONTROL_PROMPT = "The three primary colors are"
CONTROL_TOKENS = 24

# A client process that opens streams and then waits to be killed.
VANISHING_CLIENT = textwrap.dedent("""
    import socket, sys, threading, grpc
    grpc_port, http_port, n, request = (int(sys.argv[1]), int(sys.argv[2]),
                                        int(sys.argv[3]), bytes.fromhex(sys.argv[4]))
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    gen = channel.unary_stream("/kvserve.v1.KvServe/Generate",
                               request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    started = threading.Semaphore(0)
    def stream():
        it = gen(request, timeout=300)
        next(it)
        started.release()
        for _ in it:
            pass
    for _ in range(n):
        threading.Thread(target=stream, daemon=True).start()
    body = (b'{"prompt": "Vanish", "max_tokens": 400, "stream": true, '
            b'"ignore_eos": true}')
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", http_port))
        s.sendall(b"POST /v1/completions HTTP/1.1\\r\\nHost: localhost\\r\\n"
                  b"Content-Type: application/json\\r\\nContent-Length: " +
                  str(len(body)).encode() + b"\\r\\n\\r\\n" + body)
        got = b""
        while b"data:" not in got:
            got += s.recv(4096)
        socks.append(s)  # never read again: the server's writes pile up
    for _ in range(n):
        started.acquire()
    print("READY", flush=True)
    threading.Event().wait()
""")


class CancelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = fu.Server("--max-num-seqs", "16", "--max-model-len",
                               "512", "--kv-cache-bytes", "128MiB")
        cls.channel = cls.server.channel()
        cls.stub = fu.PB_GRPC.KvServeStub(cls.channel)
        cls.reference, _ = fu.run_stream(
            cls.stub, fu.greedy(CONTROL_PROMPT, CONTROL_TOKENS))

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.kill()

    def start_control(self):
        """Runs the control request on its own thread; join() then check."""
        out = {}

        def run():
            out["tokens"], _ = fu.run_stream(
                self.stub, fu.greedy(CONTROL_PROMPT, CONTROL_TOKENS))
        t = threading.Thread(target=run)
        t.start()
        return t, out

    def check_clean(self, before, admitted_at_least):
        m = self.server.wait_idle()
        self.assertIsNone(self.server.proc.poll(), self.server.text())
        self.assertEqual(m[fu.ACTIVE], 0)
        self.assertEqual(m[fu.RUNNING], 0)
        self.assertEqual(m[fu.WAITING], 0)
        done = sum(fu.finished(m, r) - fu.finished(before, r)
                   for r in ("stop", "length", "cancelled", "deadline",
                             "error"))
        self.assertGreaterEqual(done, admitted_at_least)
        self.assertEqual(fu.finished(m, "error"), fu.finished(before, "error"))
        tokens, _ = fu.run_stream(self.stub,
                                  fu.greedy(CONTROL_PROMPT, CONTROL_TOKENS))
        self.assertEqual(tokens, self.reference)
        return m

    def test_storm_of_random_cancels(self):
        before = self.server.metrics()
        control, out = self.start_control()
        counts = asyncio.run(self.storm())
        control.join(timeout=300)
        print(f"\nstorm: {counts}", flush=True)
        self.assertEqual(out.get("tokens"), self.reference)
        self.assertEqual(sum(counts.values()), STORM)
        self.assertEqual(set(counts) - {"CANCELLED", "OK"}, set(), counts)
        self.assertGreater(counts.get("CANCELLED", 0), STORM // 2)
        m = self.check_clean(before, 0)
        self.assertGreaterEqual(fu.finished(m, "cancelled") -
                                fu.finished(before, "cancelled"),
                                counts["CANCELLED"] // 2)

    async def storm(self):
        import grpc
        rng = random.Random(7)
        counts = {}
        sem = asyncio.Semaphore(IN_FLIGHT)

        async def one(i):
            mode = rng.choice(("before", "after_tokens", "timed"))
            max_tokens = rng.randint(8, 64)
            arg = rng.random()
            async with sem:
                call = stub.Generate(fu.greedy(f"Storm {i}: a story",
                                               max_tokens), timeout=300)
                try:
                    if mode == "before":
                        await asyncio.sleep(arg * 0.01)
                        call.cancel()
                    elif mode == "timed":
                        asyncio.get_running_loop().call_later(
                            arg * 0.3, call.cancel)
                    k = int(arg * 6) + 1
                    async for _ in call:
                        k -= 1
                        if mode == "after_tokens" and k == 0:
                            call.cancel()
                    code = "OK"
                except asyncio.CancelledError:
                    code = "CANCELLED"
                except grpc.aio.AioRpcError as e:
                    code = e.code().name
                counts[code] = counts.get(code, 0) + 1

        async with self.server.aio_channel() as channel:
            stub = fu.PB_GRPC.KvServeStub(channel)
            await asyncio.gather(*[one(i) for i in range(STORM)])
        return counts

    def test_vanishing_clients(self):
        before = self.server.metrics()
        n = 5  # 3n streams + the control fit --max-num-seqs 16
        request = fu.greedy("Vanish", 400).SerializeToString().hex()
        client = subprocess.Popen(
            [sys.executable, "-c", VANISHING_CLIENT, str(self.server.grpc_port),
             str(self.server.http_port), str(n), request],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            line = client.stdout.readline()
            self.assertEqual(line.strip(), b"READY", line + client.stdout.read()
                             if client.poll() is not None else line)
            # And in this process: SSE streams reset mid-stream.
            socks = [fu.sse_request(self.server.http_port,
                                    {"prompt": f"Reset {i}", "max_tokens": 400,
                                     "ignore_eos": True})
                     for i in range(n)]
            control, out = self.start_control()
            client.kill()  # no cancel, no FIN from the application
            for s in socks:
                fu.close_abruptly(s)
            control.join(timeout=300)
        finally:
            if client.poll() is None:
                client.kill()
            client.wait()
            client.stdout.close()
        self.assertEqual(out.get("tokens"), self.reference)
        m = self.check_clean(before, 3 * n)
        self.assertGreaterEqual(fu.finished(m, "cancelled") -
                                fu.finished(before, "cancelled"), 3 * n)


if __name__ == "__main__":
    sys.exit(fu.main(__doc__))
