#!/usr/bin/env python3
"""End-to-end security test of the real kvserve binary (docs/SECURITY.md).

With certificates this test makes with the `openssl` CLI (a CA, a server
certificate, a client certificate, and a client certificate from a rogue
CA), it checks:
  - mutual TLS on gRPC (grpcio secure channels) and HTTPS (ssl module): a
    client with a certificate from the CA gets through; no certificate, a
    rogue certificate, or plaintext is refused;
  - one-way TLS;
  - bearer tokens: UNAUTHENTICATED / 401 (OpenAI error shape) without, or
    with a wrong, token on every kvserve.v1 method and /v1 route, while
    gRPC health, /health, /ready (and /metrics unless --auth-metrics) stay
    open; the tokens never appear in the server's output at debug level;
  - limits with errors naming the field and the limit: message/body size,
    prompt tokens, max_tokens, stop strings, concurrent streams per gRPC
    connection;
  - model names: the API's `model` never opens a file, and --model-dirs
    refuses absolute paths outside, ../ traversal, and symlinks leading out;
  - prefix-cache isolation by cache_salt through the authenticated server.

    security_e2e_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio, grpcio-tools, or openssl is missing.
"""

import argparse
import http.client
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, compile_proto  # noqa: E402,F401

ARGS = None
PB = None  # kvserve_pb2
PB_GRPC = None  # kvserve_pb2_grpc
CERTS = None  # directory of the generated PEM files
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_certs(d):
    """ca, server (localhost / 127.0.0.1), client, and rogue-CA client."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
          "-nodes"]
    for ca in ("ca", "rogue"):
        openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out",
                f"{ca}.pem", "-days", "2", "-subj", f"/CN=kvserve-test-{ca}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    leaves = [("server", "ca", "serverAuth",
               "subjectAltName=DNS:localhost,IP:127.0.0.1"),
              ("client", "ca", "clientAuth", None),
              ("rogue_client", "rogue", "clientAuth", None)]
    for name, ca, usage, san in leaves:
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write("basicConstraints=CA:FALSE\n"
                    f"extendedKeyUsage={usage}\n")
            if san:
                f.write(san + "\n")
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem",
                "-CAkey", f"{ca}.key", "-CAcreateserial", "-out",
                f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


def pem(name):
    with open(os.path.join(CERTS, name), "rb") as f:
        return f.read()


def cert_path(name):
    return os.path.join(CERTS, name)


def write_tokens(d, tokens):
    path = os.path.join(d, "tokens.txt")
    with open(path, "w") as f:
        f.write("# kvserve bearer tokens\n\n")
        for t in tokens:
            f.write(f"  {t}  \n")
    return path


def greedy(prompt, max_tokens, **kw):
    return PB.GenerateRequest(
        prompt=prompt,
        sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                   ignore_eos=True, **kw))


def run_stream(stub, request, metadata=None, timeout=60):
    tokens, last = [], None
    for msg in stub.Generate(request, metadata=metadata, timeout=timeout):
        tokens += list(msg.token_ids)
        last = msg
    return tokens, last


class Server(KvserveProcess):
    """The default model on free ports, served over TLS."""

    def __init__(self, *extra, client_cert=True):
        super().__init__(ARGS.binary, ARGS.source_dir, *extra)
        self.client_cert = client_cert

    def channel(self, cert="client", token=None):
        """A TLS channel; cert=None: no client certificate."""
        import grpc
        creds = grpc.ssl_channel_credentials(
            root_certificates=pem("ca.pem"),
            private_key=pem(f"{cert}.key") if cert else None,
            certificate_chain=pem(f"{cert}.pem") if cert else None)
        if token is not None:
            creds = grpc.composite_channel_credentials(
                creds, grpc.access_token_call_credentials(token))
        return grpc.secure_channel(
            f"127.0.0.1:{self.grpc_port}", creds,
            options=[("grpc.ssl_target_name_override", "localhost")])

    def ssl_context(self, cert="client"):
        ctx = ssl.create_default_context(cafile=cert_path("ca.pem"))
        if cert:
            ctx.load_cert_chain(cert_path(f"{cert}.pem"),
                                cert_path(f"{cert}.key"))
        return ctx

    def https(self, method, path, body=None, token=None, cert="client"):
        """(status, parsed JSON or text) over HTTPS."""
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = body if isinstance(body, (bytes, type(None))) else (
            json.dumps(body).encode())
        req = urllib.request.Request(
            f"https://127.0.0.1:{self.http_port}{path}", data=data,
            headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=30,
                                        context=self.ssl_context(cert)) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode("utf-8", "replace")


def health_check(channel):
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
    return check(b"", timeout=10)


class MutualTlsAndTokensTest(unittest.TestCase):
    """mTLS + bearer tokens, at debug log level."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.tokens = [secrets.token_urlsafe(24), secrets.token_urlsafe(24)]
        cls.server = Server(
            "--tls-cert", cert_path("server.pem"),
            "--tls-key", cert_path("server.key"),
            "--tls-client-ca", cert_path("ca.pem"),
            "--auth-token-file", write_tokens(cls.tmp, cls.tokens),
            "--log-level", "debug", "--max-model-len", "512",
            "--kv-cache-bytes", "64MiB")
        cls.stub = PB_GRPC.KvServeStub(cls.server.channel())

    @classmethod
    def tearDownClass(cls):
        cls.server.kill()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def auth(self, token):
        return [("authorization", f"Bearer {token}")]

    def test_grpc_with_certificate_and_token_serves(self):
        for token in self.tokens:
            tokens, last = run_stream(self.stub, greedy("Hello", 4),
                                      metadata=self.auth(token))
            self.assertEqual(len(tokens), 4)
            self.assertEqual(last.finish_reason, PB.FINISH_REASON_LENGTH)
        # The standard call credentials send the same header.
        with self.server.channel(token=self.tokens[0]) as ch:
            info = PB_GRPC.KvServeStub(ch).GetModelInfo(
                PB.GetModelInfoRequest(), timeout=10)
            self.assertGreater(info.max_context, 0)

    def test_grpc_without_or_with_wrong_token_is_unauthenticated(self):
        import grpc
        calls = {
            "Generate": lambda md: run_stream(self.stub, greedy("Hi", 2),
                                              metadata=md),
            "Tokenize": lambda md: self.stub.Tokenize(
                PB.TokenizeRequest(text="hi"), metadata=md, timeout=10),
            "Detokenize": lambda md: self.stub.Detokenize(
                PB.DetokenizeRequest(token_ids=[1]), metadata=md, timeout=10),
            "GetModelInfo": lambda md: self.stub.GetModelInfo(
                PB.GetModelInfoRequest(), metadata=md, timeout=10),
        }
        bad = [None, [("authorization", "Bearer wrong-token")],
               [("authorization", f"Basic {self.tokens[0]}")],
               [("authorization", f"Bearer {self.tokens[0]}x")],
               [("authorization", "Bearer " + self.tokens[0][:-1])]]
        for name, call in calls.items():
            for md in bad:
                with self.assertRaises(grpc.RpcError, msg=name) as e:
                    call(md)
                self.assertEqual(e.exception.code(),
                                 grpc.StatusCode.UNAUTHENTICATED, name)
                self.assertIn("authorization", e.exception.details())

    def test_grpc_health_stays_open(self):
        self.assertEqual(health_check(self.server.channel()), b"\x08\x01")

    def test_grpc_client_without_accepted_certificate_is_refused(self):
        import grpc
        for cert in (None, "rogue_client"):
            with self.server.channel(cert=cert) as ch:
                with self.assertRaises(grpc.RpcError, msg=cert) as e:
                    health_check(ch)
                self.assertEqual(e.exception.code(),
                                 grpc.StatusCode.UNAVAILABLE, cert)
        with grpc.insecure_channel(f"127.0.0.1:{self.server.grpc_port}") as ch:
            with self.assertRaises(grpc.RpcError) as e:
                health_check(ch)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_https_probes_open_api_needs_token(self):
        s = self.server
        for path in ("/health", "/ready", "/metrics"):
            self.assertEqual(s.https("GET", path)[0], 200, path)
        for token in (None, "wrong", self.tokens[0] + "x"):
            for method, path, body in (
                    ("GET", "/v1/models", None),
                    ("POST", "/v1/completions",
                     {"prompt": "Hi", "max_tokens": 2}),
                    ("GET", "/v1/unknown-route", None)):
                status, err = s.https(method, path, body, token=token)
                self.assertEqual(status, 401, (path, token))
                self.assertEqual(err["error"]["type"], "authentication_error")
                self.assertIn("authorization", err["error"]["message"])
        status, models = s.https("GET", "/v1/models", token=self.tokens[1])
        self.assertEqual(status, 200)
        status, out = s.https(
            "POST", "/v1/completions",
            {"prompt": "Hello", "max_tokens": 3, "temperature": 0,
             "ignore_eos": True}, token=self.tokens[0])
        self.assertEqual(status, 200, out)
        self.assertEqual(out["usage"]["completion_tokens"], 3)

    def test_https_client_without_accepted_certificate_is_refused(self):
        for cert in (None, "rogue_client"):
            with self.assertRaises((http.client.HTTPException, OSError),
                                   msg=cert):
                self.server.https("GET", "/health", cert=cert)
        with self.assertRaises((http.client.HTTPException, OSError)):
            urllib.request.urlopen(
                f"http://127.0.0.1:{self.server.http_port}/health",
                timeout=10).read()

    def test_cache_salt_isolates_tenants(self):
        prompt = "Salted tenant check:" + " one shared prefix" * 12
        md = self.auth(self.tokens[0])

        def cached(salt):
            req = greedy(prompt, 2)
            req.cache_salt = salt
            return run_stream(self.stub, req, metadata=md)[1] \
                .usage.cached_prompt_tokens

        self.assertEqual(cached("tenant-a"), 0)
        self.assertEqual(cached("tenant-b"), 0, "prefix shared across salts")
        self.assertGreater(cached("tenant-a"), 0, "same salt must hit")

        # The same over the OpenAI API ("cache_salt", vLLM's extension).
        def http_cached(salt):
            status, out = self.server.https(
                "POST", "/v1/completions",
                {"prompt": "HTTP " + prompt, "max_tokens": 2,
                 "cache_salt": salt}, token=self.tokens[0])
            self.assertEqual(status, 200, out)
            return out["usage"]["prompt_tokens_details"]["cached_tokens"]

        self.assertEqual(http_cached("tenant-c"), 0)
        self.assertEqual(http_cached("tenant-d"), 0)
        self.assertGreater(http_cached("tenant-c"), 0)

    def test_request_ids_are_escaped_in_logs(self):
        # A client's request_id once reached the debug log raw: a forged
        # line, terminal escape codes.
        req = greedy("Hi", 1)
        req.request_id = "id\x1b[31m\nkvserve FORGED LINE"
        run_stream(self.stub, req, metadata=self.auth(self.tokens[0]))
        deadline = time.monotonic() + 10
        while "FORGED" not in self.server.text() and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        out = self.server.text()
        self.assertIn("id\\x1b[31m\\nkvserve FORGED LINE", out)
        self.assertNotIn("\x1b[31m", out)
        self.assertNotIn("\nkvserve FORGED LINE", out)

    def test_tokens_never_logged(self):
        # Traffic of every kind first: accepted, refused, and HTTP.
        run_stream(self.stub, greedy("Hi", 2), metadata=self.auth(
            self.tokens[0]))
        self.server.https("GET", "/v1/models", token=self.tokens[1])
        self.server.https("GET", "/v1/models", token=self.tokens[1] + "x")
        out = self.server.text()
        self.assertIn("bearer-token authentication on (2 tokens, 2 tenants)",
                      out)
        for token in self.tokens:
            self.assertNotIn(token, out)
            self.assertNotIn(token[:12], out)


class LimitsTest(unittest.TestCase):
    """One-way TLS, tokens also on /metrics, --model-dirs, and limits."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.token = secrets.token_urlsafe(24)
        cls.server = Server(
            "--tls-cert", cert_path("server.pem"),
            "--tls-key", cert_path("server.key"),
            "--auth-token-file", write_tokens(cls.tmp, [cls.token]),
            "--auth-metrics",
            "--model-dirs", os.path.join(ARGS.source_dir, "weights"),
            "--max-request-bytes", "65536", "--max-prompt-tokens", "64",
            "--max-tokens-limit", "32", "--max-concurrent-streams", "1",
            "--max-model-len", "512", "--kv-cache-bytes", "64MiB")
        cls.md = [("authorization", f"Bearer {cls.token}")]
        cls.channel = cls.server.channel(cert=None)
        cls.stub = PB_GRPC.KvServeStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.kill()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def grpc_error(self, request):
        import grpc
        with self.assertRaises(grpc.RpcError) as e:
            run_stream(self.stub, request, metadata=self.md)
        return e.exception.code(), e.exception.details()

    def http_error(self, body):
        status, err = self.server.https("POST", "/v1/completions", body,
                                        token=self.token, cert=None)
        return status, err["error"]

    def test_one_way_tls_serves(self):
        tokens, _ = run_stream(self.stub, greedy("Hello", 3),
                               metadata=self.md)
        self.assertEqual(len(tokens), 3)

    def test_metrics_needs_token_with_auth_metrics(self):
        s = self.server
        self.assertEqual(s.https("GET", "/metrics", cert=None)[0], 401)
        self.assertEqual(
            s.https("GET", "/metrics", token=self.token, cert=None)[0], 200)
        self.assertEqual(s.https("GET", "/health", cert=None)[0], 200)
        self.assertEqual(s.https("GET", "/ready", cert=None)[0], 200)

    def test_message_size_limit(self):
        import grpc
        code, details = self.grpc_error(greedy("x" * 70000, 2))
        self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED)
        self.assertIn("65536", details)
        status, err = self.http_error({"prompt": "x" * 70000})
        self.assertEqual(status, 413)
        self.assertIn("--max-request-bytes", err["message"])
        self.assertIn("65536", err["message"])
        # Chunked bodies are read up to the limit: a small one is served,
        # one that grows past the limit gets 413 (and the connection closes).
        for chunks, want in (([b'{"prompt": "Hi", ', b'"max_tokens": 2}'], 200),
                             ([b'{"prompt": "'] + [b"x" * 8192] * 10 +
                              [b'"}'], 413)):
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.server.http_port, timeout=30,
                context=self.server.ssl_context(cert=None))
            try:
                conn.request("POST", "/v1/completions", body=iter(chunks),
                             headers={"Authorization": f"Bearer {self.token}",
                                      "Content-Type": "application/json"},
                             encode_chunked=True)
                resp = conn.getresponse()
                body = json.loads(resp.read())
                self.assertEqual(resp.status, want, body)
                if want == 413:
                    self.assertIn("65536", body["error"]["message"])
                    self.assertIn("--max-request-bytes",
                                  body["error"]["message"])
                else:
                    self.assertEqual(body["usage"]["completion_tokens"], 2)
            finally:
                conn.close()

    def test_prompt_and_max_tokens_limits(self):
        import grpc
        long_prompt = "one two three four five six seven eight " * 12
        code, details = self.grpc_error(greedy(long_prompt, 2))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(details.startswith("prompt:"), details)
        self.assertIn("limit of 64", details)
        code, details = self.grpc_error(greedy("Hi", 33))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(details.startswith("sampling.max_tokens:"), details)
        self.assertIn("32", details)
        status, err = self.http_error({"prompt": long_prompt})
        self.assertEqual((status, err["param"]), (400, "prompt"))
        status, err = self.http_error({"prompt": "Hi", "max_tokens": 33})
        self.assertEqual((status, err["param"]), (400, "max_tokens"))
        # An unset max_tokens stays within the limit.
        tokens, _ = run_stream(self.stub, PB.GenerateRequest(
            prompt="Hi", sampling=PB.SamplingParams(ignore_eos=True)),
            metadata=self.md)
        self.assertLessEqual(len(tokens), 32)

    def test_stop_string_limits(self):
        import grpc
        code, details = self.grpc_error(greedy("Hi", 2, stop=["s"] * 17))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("sampling.stop: at most 16", details)
        code, details = self.grpc_error(greedy("Hi", 2, stop=["s" * 300]))
        self.assertEqual(code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("sampling.stop[0]", details)
        self.assertIn("256", details)
        status, err = self.http_error({"prompt": "Hi", "stop": ["s"] * 17})
        self.assertEqual((status, err["param"]), (400, "stop"))

    def test_concurrent_streams_per_connection(self):
        """Three streams on one connection with a limit of one: all finish,
        and the server never has two open at once."""
        results, errors = [], []

        def one():
            try:
                results.append(run_stream(self.stub, greedy("Count:", 24),
                                          metadata=self.md)[0])
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(3)]
        for t in threads:
            t.start()
        most = 0
        while any(t.is_alive() for t in threads):
            status, body = self.server.https("GET", "/metrics",
                                             token=self.token, cert=None)
            for line in body.splitlines():
                if line.startswith("kvserve_grpc_open_streams"):
                    most = max(most, float(line.rsplit(" ", 1)[1]))
            time.sleep(0.01)  # poll interval, not synchronization
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual([len(r) for r in results], [24, 24, 24])
        self.assertLessEqual(most, 1)

    def test_api_model_names_never_open_files(self):
        for name in ("../../etc/passwd", "/etc/passwd", "file:///etc/passwd",
                     "smollm2-135m/../../../../etc/passwd",
                     os.path.join(ARGS.source_dir, "weights", "..",
                                  "README.md")):
            status, err = self.http_error({"prompt": "Hi", "max_tokens": 2,
                                           "model": name})
            self.assertEqual(status, 404, name)
            self.assertEqual(err["code"], "model_not_found")
            self.assertIn("is not served here", err["message"])
        tokens, _ = run_stream(self.stub, greedy("Still serving", 2),
                               metadata=self.md)
        self.assertEqual(len(tokens), 2)


class StartupRefusalTest(unittest.TestCase):
    """Configurations refused before a port is bound or a model loads."""

    def refused(self, *args):
        proc = subprocess.run([ARGS.binary, "--port", "0", "--metrics-port",
                               "0", *args], capture_output=True, text=True,
                              timeout=60)
        self.assertNotEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("kvserve: listening", proc.stderr)
        return proc.stderr

    def test_model_dirs_confine_model_paths(self):
        weights = os.path.abspath(
            os.path.join(ARGS.source_dir, "weights", MODEL_FILE))
        with tempfile.TemporaryDirectory() as d:
            os.symlink(weights, os.path.join(d, "escape.gguf"))
            os.mkdir(os.path.join(d, "sub"))
            cases = [weights, "escape.gguf", os.path.join(d, "escape.gguf"),
                     "../../../../../etc/passwd",
                     os.path.join(d, "sub", *[".."] * 12, "etc", "passwd")]
            for model in cases:
                err = self.refused("--model-dirs", d, "--model", model)
                self.assertIn("outside the allowed model directories", err,
                              model)

    def test_bad_tls_and_token_files(self):
        with tempfile.TemporaryDirectory() as d:
            empty = write_tokens(d, [])
            err = self.refused("--auth-token-file", empty)
            self.assertIn("--auth-token-file", err)
            self.assertIn("holds no token", err)
        err = self.refused("--tls-cert", cert_path("server.pem"))
        self.assertIn("--tls-cert: needs --tls-key", err)
        err = self.refused("--tls-cert", cert_path("server.pem"),
                           "--tls-key", cert_path("client.key"))
        self.assertIn("--tls-key", err)
        self.assertIn("is not the key of", err)
        err = self.refused("--tls-client-ca", cert_path("ca.pem"))
        self.assertIn("--tls-client-ca", err)


def main():
    global ARGS, PB, PB_GRPC, CERTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (pip install grpcio==1.85.1 grpcio-tools==1.85.1)")
        return 77
    if shutil.which("openssl") is None:
        print("SKIP: the openssl CLI is missing (apt-get install openssl)")
        return 77
    with tempfile.TemporaryDirectory() as out:
        CERTS = os.path.join(out, "certs")
        os.mkdir(CERTS)
        make_certs(CERTS)
        PB, PB_GRPC = compile_proto(os.path.join(ARGS.source_dir, "proto"),
                                    out)
        prog = unittest.main(argv=[sys.argv[0], *rest], exit=False,
                             verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
