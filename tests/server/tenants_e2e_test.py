#!/usr/bin/env python3
"""End-to-end test of tenants against the real kvserve binary
(docs/SECURITY.md, "Tenants"), each case a reproduction of the outside
probe that failed before tenants existed:
  - the digit oracle: a second token holder who knows a prompt's template
    guesses its secret one digit at a time, keeping the guess with the
    larger usage.prompt_tokens_details.cached_tokens. It recovers the code
    in a daemon without tokens (one tenant: the control that shows the
    oracle is real), recovers nothing across tenants, and sees whole blocks
    only across a shared scope;
  - /v1/kv/state lists only the caller's tenant (an admin sees all);
  - HTTP priorities clamped to the tenant's range; per-tenant metrics;
  - amplification: n x prompts past --max-num-seqs, a call's tokens past
    max_request_tokens, a tenant's queue past max_queued, a non-streamed
    logprobs response past --max-response-bytes;
  - HTTP framing, Host and Content-Type against the daemon;
  - the token file reloaded on SIGHUP;
  - chat without max_tokens on a pool smaller than one context.

    tenants_e2e_test.py --binary build/server/kvserve --source-dir .

Cost: four daemons of the default model, about 25 s on 2 vCPUs.
"""

import argparse
import http.client
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, counter  # noqa: E402

ARGS = None
BLOCK = 16  # the daemon's default --block-size
TEMPLATE = ("Account record 73611. The customer's one-time code is {code}. "
            "Please verify the customer's identity before any change to "
            "the account.")
SECRET = "942751"

TOKENS = """# tenants of tenants_e2e_test.py
tok-alice tenant=alice
tok-bob tenant=bob
tok-carol tenant=carol cache_scope=sys
tok-dave tenant=dave cache_scope=sys
tok-ops tenant=ops admin
tok-eve tenant=eve priority=0..2 max_queued=2 max_request_tokens=300
"""


class Server(KvserveProcess):
    def __init__(self, *extra):
        super().__init__(ARGS.binary, ARGS.source_dir, "--max-model-len",
                         "1024", "--kv-cache-bytes", "64MiB", *extra)

    def request(self, method, path, body=None, token=None, headers=None):
        """(status, parsed JSON or text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port,
                                          timeout=60)
        h = {"Content-Type": "application/json"}
        if token:
            h["Authorization"] = f"Bearer {token}"
        h.update(headers or {})
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=h)
            resp = conn.getresponse()
            raw = resp.read().decode("utf-8", "replace")
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw
        finally:
            conn.close()

    def cached(self, prompt, token=None):
        status, out = self.request("POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": 1, "temperature": 0}, token)
        assert status == 200, out
        return out["usage"]["prompt_tokens_details"]["cached_tokens"]

    def raw(self, data):
        """Raw bytes to the HTTP port; everything until the server closes."""
        with socket.create_connection(("127.0.0.1", self.http_port),
                                      timeout=30) as s:
            s.sendall(data)
            out = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return out.decode("utf-8", "replace")
                out += chunk


def digit_attack(server, victim, attacker):
    """The probe's attack: the victim's prompt is cached, then the attacker
    guesses the code digit by digit. Returns (recovered code, per position
    the cached_tokens of each guess)."""
    server.cached(TEMPLATE.format(code=SECRET), victim)
    known, seen = "", []
    prefix = TEMPLATE.split("{code}")[0]
    for _ in range(len(SECRET)):
        # A word after the guess: a prompt's last token is never cached
        # (its logits are needed), so the guess must not be last.
        counts = [server.cached(prefix + known + str(d) + " ok", attacker)
                  for d in range(10)]
        seen.append(counts)
        known += str(max(range(10), key=lambda d: (counts[d], -d)))
    return known, seen


def unique_best(counts, digit):
    return all(counts[digit] > c for d, c in enumerate(counts) if d != digit)


class OracleTest(unittest.TestCase):
    def test_single_tenant_daemon_has_the_oracle(self):
        # The control: one tenant (no token file) shares its cache at token
        # granularity, as documented; the attack recovers the code. If it
        # did not, the tests below could not fail.
        server = Server()
        try:
            code, seen = digit_attack(server, None, None)
        finally:
            server.kill()
        self.assertEqual(code, SECRET, seen)

    def test_across_tenants_and_within_a_shared_scope(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "tokens")
            with open(path, "w") as f:
                f.write(TOKENS)
            server = Server("--auth-token-file", path)
            try:
                private = digit_attack(server, "tok-alice", "tok-bob")
                shared = digit_attack(server, "tok-carol", "tok-dave")
            finally:
                server.kill()
        code, seen = private
        self.assertNotEqual(code, SECRET)
        for pos, counts in enumerate(seen):
            self.assertFalse(unique_best(counts, int(SECRET[pos])),
                             (pos, counts))
        # The attacker's guesses hit only its own earlier guesses: never
        # more than the template's whole blocks it sent itself.
        code, seen = shared
        self.assertNotEqual(code, SECRET, seen)
        for counts in seen:
            for c in counts:
                self.assertEqual(c % BLOCK, 0, seen)


class TenantServerTest(unittest.TestCase):
    """One daemon with the token file above."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.tokens = os.path.join(cls.tmp.name, "tokens")
        with open(cls.tokens, "w") as f:
            f.write(TOKENS)
        cls.server = Server("--auth-token-file", cls.tokens,
                            "--max-num-seqs", "8",
                            "--scheduling-policy", "priority",
                            "--max-response-bytes", "512KiB")

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        cls.tmp.cleanup()

    def post(self, body, token="tok-alice", path="/v1/completions"):
        return self.server.request("POST", path, body, token)

    def start_stream(self, token, max_tokens=400, priority=None):
        """A streaming completion left running; returns its connection."""
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port,
                                          timeout=60)
        body = {"prompt": "Tell me a long story.", "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True}
        if priority is not None:
            body["priority"] = priority
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json",
                              "Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        self.assertEqual(resp.status, 200)
        resp.readline()  # the first event: it is running
        return conn

    def kv_requests(self, token):
        status, st = self.server.request("GET", "/v1/kv/state", token=token)
        self.assertEqual(status, 200, st)
        return st["requests"]

    def test_kv_state_is_scoped_to_the_tenant(self):
        alice = self.start_stream("tok-alice")
        eve = self.start_stream("tok-eve", max_tokens=250, priority=100)
        try:
            deadline = time.monotonic() + 30
            while True:
                everyone = self.kv_requests("tok-ops")
                tenants = {r["tenant"] for r in everyone["running"]}
                if {"alice", "eve"} <= tenants or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            self.assertEqual(everyone["scope"], "all")
            self.assertLessEqual({"alice", "eve"}, tenants)
            mine = self.kv_requests("tok-bob")
            self.assertEqual(mine["scope"], "tenant")
            self.assertEqual(mine["running"] + mine["waiting"], [])
            self.assertEqual(mine["num_running"], 0)
            own = self.kv_requests("tok-alice")["running"]
            self.assertEqual({r["tenant"] for r in own}, {"alice"})
            # eve's priority 100 was clamped to her range, 0..2.
            eve_rows = [r for r in everyone["running"]
                        if r["tenant"] == "eve"]
            self.assertEqual([r["priority"] for r in eve_rows], [2])
        finally:
            alice.close()
            eve.close()

    def test_per_tenant_metrics(self):
        before = self.server.metrics()
        for _ in range(2):
            status, out = self.post({"prompt": "Hi there", "max_tokens": 2},
                                    token="tok-bob")
            self.assertEqual(status, 200, out)
        after = self.server.wait_metrics(
            lambda m: counter(m, "kvserve_tenant_requests_total",
                              tenant="bob") >=
            counter(before, "kvserve_tenant_requests_total", tenant="bob") + 2)
        self.assertEqual(
            counter(after, "kvserve_tenant_requests_total", tenant="bob") -
            counter(before, "kvserve_tenant_requests_total", tenant="bob"), 2)
        self.assertEqual(
            counter(after, "kvserve_tenant_generation_tokens_total",
                    tenant="bob") -
            counter(before, "kvserve_tenant_generation_tokens_total",
                    tenant="bob"), 4)

    def test_amplification_is_bounded(self):
        # 64 prompts x n 16: 1024 sequences from 397 bytes.
        status, err = self.post({"prompt": ["a"] * 64, "n": 16,
                                 "max_tokens": 8})
        self.assertEqual(status, 400, err)
        self.assertIn("n: 1024 completions in this request", err["error"]
                      ["message"])
        self.assertIn("--max-num-seqs", err["error"]["message"])
        self.assertEqual(err["error"]["param"], "n")
        # One prompt, n past the running sequences.
        status, err = self.post({"prompt": "a", "n": 9, "max_tokens": 8})
        self.assertEqual(status, 400, err)
        # A tenant's tokens per call: eve may ask for 300.
        status, err = self.post({"prompt": "a", "n": 2, "max_tokens": 200},
                                token="tok-eve")
        self.assertEqual(status, 400, err)
        self.assertIn("max_request_tokens", err["error"]["message"])
        # ... named as the client named it.
        status, err = self.post({"messages": [{"role": "user",
                                               "content": "hi"}],
                                 "max_completion_tokens": 900},
                                token="tok-eve", path="/v1/chat/completions")
        self.assertEqual(status, 400, err)
        self.assertTrue(err["error"]["message"].startswith(
            "max_completion_tokens:"), err)
        # A non-streamed response that would buffer too much: stream it.
        status, err = self.post({"prompt": "a", "max_tokens": 900,
                                 "logprobs": 20})
        self.assertEqual(status, 400, err)
        self.assertIn("--max-response-bytes", err["error"]["message"])
        self.assertEqual(err["error"]["param"], "stream")

    def test_tenant_queue_cap(self):
        # eve may hold 2 completions waiting: the flood beyond gets 429.
        results = []

        def one():
            results.append(self.post({"prompt": "flood", "max_tokens": 32,
                                      "ignore_eos": True}, token="tok-eve"))

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(s for s, _ in results)
        self.assertIn(429, codes, results)
        refused = [b for s, b in results if s == 429]
        self.assertIn("tenant 'eve'", refused[0]["error"]["message"])
        self.assertIn(200, codes)

    def test_http_framing_host_and_content_type(self):
        s = self.server
        status, err = s.request("POST", "/v1/completions",
                                {"prompt": "a", "max_tokens": 1}, "tok-alice",
                                headers={"Content-Type": "text/plain"})
        self.assertEqual(status, 415, err)
        status, err = s.request("GET", "/v1/models", None, "tok-alice",
                                headers={"Host": "rebind.example:9090"})
        self.assertEqual(status, 403, err)
        self.assertEqual(err["error"]["code"], "host_not_allowed")
        status, _ = s.request("GET", "/health", None,
                              headers={"Host": "rebind.example"})
        self.assertEqual(status, 200)
        before = s.metrics()
        smuggled = (b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                    b"Authorization: Bearer tok-alice\r\n"
                    b"Content-Type: application/json\r\n"
                    b"Transfer-Encoding: gzip\r\n\r\n"
                    b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n"
                    b"Authorization: Bearer tok-alice\r\n\r\n")
        out = s.raw(smuggled)
        self.assertTrue(out.startswith("HTTP/1.1 501"), out)
        self.assertEqual(out.count("HTTP/1.1"), 1, out)
        after = s.metrics()
        self.assertEqual(
            counter(after, "kvserve_http_requests_total", code="200",
                    route="/v1/models"),
            counter(before, "kvserve_http_requests_total", code="200",
                    route="/v1/models"))
        out = s.raw(b"GET /health HTTP/1.1\r\n\r\n")
        self.assertTrue(out.startswith("HTTP/1.1 400"), out)

    def test_sighup_reloads_the_token_file(self):
        status, _ = self.server.request("GET", "/v1/models", token="tok-new")
        self.assertEqual(status, 401)
        with open(self.tokens, "w") as f:
            f.write(TOKENS + "tok-new tenant=newcomer\n")
        try:
            self.server.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                status, _ = self.server.request("GET", "/v1/models",
                                                token="tok-new")
                if status == 200:
                    break
                time.sleep(0.1)
            self.assertEqual(status, 200)
            # A broken file keeps the tokens in use.
            with open(self.tokens, "w") as f:
                f.write("tok-new weight=none\n")
            self.server.proc.send_signal(signal.SIGHUP)
            m = self.server.wait_metrics(lambda m: counter(
                m, "kvserve_auth_reloads_total", result="failed") >= 1)
            self.assertEqual(counter(m, "kvserve_auth_reloads_total",
                                     result="failed"), 1)
            self.assertEqual(self.server.request(
                "GET", "/v1/models", token="tok-new")[0], 200)
        finally:
            with open(self.tokens, "w") as f:
                f.write(TOKENS)
            self.server.proc.send_signal(signal.SIGHUP)


class SmallPoolTest(unittest.TestCase):
    def test_chat_without_max_tokens_fits_a_pool_below_one_context(self):
        # 1 MiB of int8 KV holds ~700 tokens, the context is 2048.
        server = KvserveProcess(ARGS.binary, ARGS.source_dir,
                                "--kv-cache-bytes", "1MiB",
                                "--max-model-len", "2048")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", server.http_port,
                                              timeout=120)
            conn.request("POST", "/v1/chat/completions", body=json.dumps({
                "messages": [{"role": "user", "content": "Say hi."}],
                "temperature": 0}),
                headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = json.loads(resp.read())
            conn.close()
            self.assertEqual(resp.status, 200, body)
            self.assertIn("less than one context", server.text())
        finally:
            server.kill()


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    model = os.path.join(ARGS.source_dir, "weights",
                         "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        print(f"SKIP: {model} missing (run deploy/setup.sh)")
        return 77
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
