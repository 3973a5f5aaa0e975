#!/usr/bin/env python3
"""Overload: ten times the sustainable load on the real kvserve binary.

Measures the sustainable request rate (closed loop at --max-num-seqs
concurrency), then offers ten times that rate open-loop over gRPC for a
fixed period, plus closed-loop OpenAI HTTP clients, while probing /health,
/ready and gRPC health and sampling resident memory. Checks: health keeps
answering fast, requests beyond --max-queued-requests get RESOURCE_EXHAUSTED
promptly (HTTP 429 in the OpenAI error shape), every admitted request
completes in full, VmRSS stays under a stated bound, and afterwards no KV
block is active. Prints the load offered and sustained.

    overload_tenfold_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import asyncio
import sys
import threading
import time
import unittest

import fault_util as fu

MAX_SEQS = 4
MAX_QUEUED = 8
MAX_TOKENS = 16
OVERLOAD_SECONDS = 20
HTTP_CLIENTS = 8
# Stated bound: the overload may grow resident memory by at most this much
# over the warmed-up server (KV cache, model and thread stacks are already
# resident then; queues are bounded, so growth is per-call buffers only).
RSS_GROWTH_BOUND_MIB = 256
# /health needs no engine work: its median latency stays low, and no probe
# waits longer than a TCP SYN retransmit or two (a full accept backlog).
HEALTH_LATENCY_BOUND_S = 5.0
HEALTH_MEDIAN_BOUND_S = 0.25


class Probe(threading.Thread):
    """Calls fn() every `period` s until stopped; records (latency, value)."""

    def __init__(self, fn, period):
        super().__init__(daemon=True)
        self.fn, self.period = fn, period
        self.samples, self.errors = [], []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                value = self.fn()
                self.samples.append((time.monotonic() - t, value))
            except Exception as e:  # noqa: BLE001 - any failure is a finding
                self.errors.append(repr(e))
            self.stop.wait(self.period)


class HttpClient(threading.Thread):
    """Posts /v1/completions back to back until stopped."""

    def __init__(self, server, i):
        super().__init__(daemon=True)
        self.server, self.i = server, i
        self.results = []  # (status, body, latency)
        self.stop = threading.Event()

    def run(self):
        n = 0
        while not self.stop.is_set():
            body = {"prompt": f"HTTP client {self.i} request {n}:",
                    "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True}
            t = time.monotonic()
            status, out = self.server.post("/v1/completions", body,
                                           timeout=120)
            self.results.append((status, out, time.monotonic() - t))
            n += 1
            if status == 429:
                self.stop.wait(0.02)  # retry soon: keep the pressure on


async def one_call(stub, i, outcomes):
    """One Generate call; appends (code name, tokens, finish, latency)."""
    import grpc
    t = time.monotonic()
    tokens, finish = 0, None
    try:
        call = stub.Generate(fu.greedy(f"Request {i}: tell me about", MAX_TOKENS),
                             timeout=300)
        async for msg in call:
            tokens += len(msg.token_ids)
            if msg.finish_reason:
                finish = msg.finish_reason
        outcomes.append(("OK", tokens, finish, time.monotonic() - t))
    except grpc.aio.AioRpcError as e:
        outcomes.append((e.code().name, tokens, e.details(),
                         time.monotonic() - t))


async def calibrate(server):
    """Sustainable rate: requests/s completed at MAX_SEQS concurrency."""
    async with server.aio_channel() as channel:
        stub = fu.PB_GRPC.KvServeStub(channel)
        outcomes = []
        n = 3 * MAX_SEQS
        t = time.monotonic()
        for start in range(0, n, MAX_SEQS):
            await asyncio.gather(*[one_call(stub, i, outcomes)
                                   for i in range(start, start + MAX_SEQS)])
        elapsed = time.monotonic() - t
        assert all(o[0] == "OK" for o in outcomes), outcomes
        return n / elapsed


async def overload(server, rate, seconds):
    """Open loop: one call every 1/rate s for `seconds`; waits for all."""
    async with server.aio_channel() as channel:
        stub = fu.PB_GRPC.KvServeStub(channel)
        outcomes, tasks = [], []
        t0 = time.monotonic()
        n = int(rate * seconds)
        for i in range(n):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one_call(stub, i, outcomes)))
        offered_s = time.monotonic() - t0
        await asyncio.gather(*tasks)
        return outcomes, offered_s, time.monotonic() - t0


class OverloadTest(unittest.TestCase):
    def test_tenfold_overload(self):
        server = fu.Server("--max-num-seqs", str(MAX_SEQS),
                           "--max-queued-requests", str(MAX_QUEUED),
                           "--kv-cache-bytes", "64MiB",
                           "--max-model-len", "256")
        try:
            self.run_overload(server)
        finally:
            server.kill()

    def run_overload(self, server):
        sustainable = asyncio.run(calibrate(server))
        rss_base = server.rss_mib()
        before = server.metrics()
        channel = server.channel()
        probes = {
            "health": Probe(lambda: server.http("/health", timeout=30)[0],
                            0.1),
            "ready": Probe(lambda: server.http("/ready", timeout=30)[0], 0.25),
            "grpc_health": Probe(lambda: server.grpc_health(channel), 0.25),
            "rss": Probe(server.rss_mib, 0.2),
        }
        http_clients = [HttpClient(server, i) for i in range(HTTP_CLIENTS)]
        for p in [*probes.values(), *http_clients]:
            p.start()
        offered = 10 * sustainable
        outcomes, offered_s, total_s = asyncio.run(
            overload(server, offered, OVERLOAD_SECONDS))
        for c in http_clients:
            c.stop.set()
        for c in http_clients:
            c.join(timeout=180)
        for p in probes.values():
            p.stop.set()
            p.join(timeout=30)
        after = server.wait_idle()
        channel.close()

        ok = [o for o in outcomes if o[0] == "OK"]
        rejected = [o for o in outcomes if o[0] == "RESOURCE_EXHAUSTED"]
        other = [o for o in outcomes if o[0] not in ("OK", "RESOURCE_EXHAUSTED")]
        http = [r for c in http_clients for r in c.results]
        http_ok = [r for r in http if r[0] == 200]
        http_429 = [r for r in http if r[0] == 429]
        health = probes["health"].samples
        health_lat = [s[0] for s in health]
        rss_peak = max([s[1] for s in probes["rss"].samples] + [rss_base])
        rej_lat = [o[3] for o in rejected] + [r[2] for r in http_429]
        print(f"\nsustainable {sustainable:.1f} req/s; offered gRPC "
              f"{len(outcomes) / offered_s:.1f} req/s for {offered_s:.1f} s "
              f"+ HTTP {len(http) / total_s:.1f} req/s; completed "
              f"{(len(ok) + len(http_ok)) / total_s:.1f} req/s "
              f"({len(ok)} gRPC + {len(http_ok)} HTTP admitted, "
              f"{len(rejected)} RESOURCE_EXHAUSTED, {len(http_429)} HTTP 429)"
              f"\nrejection latency p50 {fu.percentile(rej_lat, .5):.3f} s "
              f"max {max(rej_lat, default=0):.3f} s; /health "
              f"{len(health)} probes p50 {fu.percentile(health_lat, .5):.3f} s"
              f" max {max(health_lat, default=0):.3f} s; VmRSS "
              f"{rss_base:.0f} -> peak {rss_peak:.0f} MiB", flush=True)

        self.assertEqual(other, [], "only OK or RESOURCE_EXHAUSTED expected")
        self.assertGreater(len(rejected), 0, "the load did not exceed the bound")
        self.assertGreater(len(ok), 0)
        for o in ok:  # every admitted request completed in full
            self.assertEqual((o[1], o[2]), (MAX_TOKENS, fu.PB.FINISH_REASON_LENGTH))
        for o in rejected:
            self.assertIn("--max-queued-requests", o[2])
        self.assertEqual({r[0] for r in http} - {200, 429}, set(), http[:3])
        self.assertGreater(len(http_429), 0)
        for r in http_ok:
            self.assertEqual(r[1]["usage"]["completion_tokens"], MAX_TOKENS)
        for r in http_429:
            self.assertEqual(r[1]["error"]["type"], "rate_limit_error")
        # Promptly: refusals take no engine time (median well under a step
        # of the admitted requests' lifetime).
        self.assertLess(fu.percentile(rej_lat, .5), 0.5)
        self.assertEqual(probes["health"].errors, [])
        self.assertTrue(all(s[1] == 200 for s in health))
        self.assertLess(max(health_lat), HEALTH_LATENCY_BOUND_S)
        self.assertLess(fu.percentile(health_lat, .5), HEALTH_MEDIAN_BOUND_S)
        self.assertGreater(len(health), OVERLOAD_SECONDS)  # it kept answering
        # Overload is not a stall: readiness and gRPC health stay up.
        self.assertEqual(probes["ready"].errors, [])
        self.assertTrue(all(s[1] == 200 for s in probes["ready"].samples))
        self.assertEqual(probes["grpc_health"].errors, [])
        self.assertTrue(all(s[1] == fu.SERVING
                            for s in probes["grpc_health"].samples))
        self.assertLess(rss_peak - rss_base, RSS_GROWTH_BOUND_MIB)
        # Afterwards: the pool is all free or cached, and the server's own
        # counts match what the clients saw.
        self.assertEqual(after.get(fu.ACTIVE), 0)
        self.assertEqual(after.get(fu.RUNNING), 0)
        self.assertEqual(fu.finished(after, "length") -
                         fu.finished(before, "length"), len(ok) + len(http_ok))
        self.assertEqual(
            after["kvserve_requests_rejected_total"] -
            before["kvserve_requests_rejected_total"],
            len(rejected) + len(http_429))
        self.assertIsNone(server.proc.poll())


if __name__ == "__main__":
    sys.exit(fu.main(__doc__))
