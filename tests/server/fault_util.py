"""Shared support for the fault_*_test.py and overload_*_test.py suites
(not a test itself): argument parsing, the proto compiled with grpcio-tools,
a kvserve process with helpers for /metrics, resident memory and health,
and small gRPC/HTTP client helpers. Loopback only.
"""
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import KvserveProcess, run_unittests  # noqa: E402

ARGS = None
PB = None  # kvserve_pb2
PB_GRPC = None  # kvserve_pb2_grpc

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"
ACTIVE = 'kvserve_kv_blocks{state="active"}'
RUNNING = 'kvserve_requests{state="running"}'
WAITING = 'kvserve_requests{state="waiting"}'


def finished(m, reason):
    return m.get(f'kvserve_requests_finished_total{{reason="{reason}"}}', 0)


class Server(KvserveProcess):
    """The default model on free ports (see kvserve_process.py). `env`
    entries are added to the environment of the process (fault injection)."""

    def __init__(self, *extra, env=None, timeout=120):
        saved = dict(os.environ)
        os.environ.update(env or {})
        try:
            super().__init__(ARGS.binary, ARGS.source_dir, *extra,
                             timeout=timeout)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def channel(self):
        import grpc
        return grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")

    def aio_channel(self):
        import grpc
        return grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}")

    def http(self, path, timeout=10):
        """(status, body text) of a GET."""
        url = f"http://127.0.0.1:{self.http_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, body, timeout=60):
        """(status, parsed JSON or text) of a POST of `body` as JSON."""
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port,
                                          timeout=timeout)
        try:
            conn.request("POST", path, body=json.dumps(body).encode(),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            raw = resp.read().decode("utf-8", "replace")
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw
        finally:
            conn.close()

    def wait_idle(self, timeout=60):
        """Waits until no block is active and no request runs or waits."""
        return self.wait_metrics(
            lambda m: m.get(ACTIVE) == 0 and m.get(RUNNING) == 0 and
            m.get(WAITING) == 0, timeout)

    def rss_mib(self):
        """Resident memory of the process (VmRSS), MiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
        raise RuntimeError("no VmRSS")

    def grpc_health(self, channel, service=b""):
        """The raw grpc.health.v1 HealthCheckResponse (SERVING/NOT_SERVING)."""
        check = channel.unary_unary(HEALTH_CHECK,
                                    request_serializer=lambda b: b,
                                    response_deserializer=lambda b: b)
        req = b"\x0a" + bytes([len(service)]) + service if service else b""
        return check(req, timeout=10)


def greedy(prompt, max_tokens):
    return PB.GenerateRequest(
        prompt=prompt,
        sampling=PB.SamplingParams(temperature=0, max_tokens=max_tokens,
                                   ignore_eos=True))


def run_stream(stub, request, timeout=120):
    """(token ids, last message) of a whole Generate stream."""
    tokens, last = [], None
    for msg in stub.Generate(request, timeout=timeout):
        tokens += list(msg.token_ids)
        last = msg
    return tokens, last


def sse_request(port, body):
    """Opens a streaming /v1/completions over a raw socket and returns the
    socket once the first event bytes arrived (for abrupt closes)."""
    data = json.dumps(dict(body, stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json\r\n" +
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while b"data:" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            raise RuntimeError(f"connection closed: {got[:200]!r}")
        got += chunk
    return sock


def close_abruptly(sock):
    """Closes with a TCP RST (SO_LINGER 0): a client that vanished."""
    import struct
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                    struct.pack("ii", 1, 0))
    sock.close()


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _setup(args, pb, pb_grpc):
    global ARGS, PB, PB_GRPC
    ARGS, PB, PB_GRPC = args, pb, pb_grpc


def main(doc):
    """run_unittests (kvserve_process.py) for the fault_*/overload_* suites,
    which keep ARGS, PB and PB_GRPC here."""
    return run_unittests(doc, _setup)
