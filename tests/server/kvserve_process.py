"""Test support shared by the Python end-to-end tests and tools (not a test
itself): a real kvserve process on free ports with its output collected by a
thread, its /metrics scraped and parsed, and the gRPC proto compiled with
grpcio-tools."""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

LISTENING = re.compile(r"kvserve: listening grpc=(\S+):(\d+) http=(\S+):(\d+)")


def compile_proto(proto_dir, out_dir):
    """Generates kvserve_pb2 / kvserve_pb2_grpc into out_dir, imports them."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    rc = protoc.main([
        "grpc_tools.protoc", f"-I{proto_dir}", f"-I{well_known}",
        f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
        os.path.join(proto_dir, "kvserve/v1/kvserve.proto"),
    ])
    if rc != 0:
        raise RuntimeError(f"grpc_tools.protoc failed with {rc}")
    sys.path.insert(0, out_dir)
    from kvserve.v1 import kvserve_pb2, kvserve_pb2_grpc  # noqa: E402
    return kvserve_pb2, kvserve_pb2_grpc


def free_port():
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token_ids(seed, n):
    """A deterministic pseudo-random prompt of n ordinary token ids."""
    x, out = seed * 7919 + 1, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(300 + x % 20000)
    return out


def counter(metrics, name, **labels):
    """One sample of parse_metrics() output by name and labels (0 if absent)."""
    key = name
    if labels:
        key += "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    return metrics.get(key, 0.0)


def metric_sum(metrics, name, **labels):
    """Sum of parse_metrics() samples of `name` whose labels include
    `labels` (all series of `name` without labels)."""
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base == name and all(f'{k}="{v}"' in rest
                                for k, v in labels.items()):
            total += value
    return total


def run_concurrently(fn, items):
    """[fn(item) for item in items], each call on its own thread at once."""
    results = [None] * len(items)

    def run(i):
        results[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,))
               for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def run_unittests(doc, setup, skip_reason=None):
    """The main() of an end-to-end test module: parses --binary and
    --source-dir, exits 77 (ctest: skipped) without grpcio/grpcio-tools or
    the default model, or when skip_reason(args) names one, compiles the
    proto, calls setup(args, kvserve_pb2, kvserve_pb2_grpc) so the module
    can keep them, and runs the unittest cases of __main__. Returns the exit
    code."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    args, rest = parser.parse_known_args()
    try:
        import grpc  # noqa: F401
        import grpc_tools  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e} (pip install grpcio==1.85.1 grpcio-tools==1.85.1)")
        return 77
    model = os.path.join(args.source_dir, "weights",
                         "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        print(f"SKIP: {model} missing (run deploy/setup.sh)")
        return 77
    reason = skip_reason(args) if skip_reason else None
    if reason:
        print(f"SKIP: {reason}")
        return 77
    with tempfile.TemporaryDirectory() as out:
        setup(args, *compile_proto(os.path.join(args.source_dir, "proto"),
                                   out))
        prog = unittest.main(argv=[sys.argv[0], *rest], exit=False,
                             verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


def thread_cpu_seconds(pid, prefix):
    """User + system CPU seconds of the process's threads whose name starts
    with `prefix` (kv-engine, kv-events, kv-tier-...), from
    /proc/<pid>/task/<tid>/stat; 0 if none."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    task = f"/proc/{pid}/task"
    for tid in os.listdir(task):
        try:
            with open(f"{task}/{tid}/comm") as f:
                if not f.read().strip().startswith(prefix):
                    continue
            with open(f"{task}/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


def parse_metrics(text):
    """Prometheus text -> {"name{labels}": value} (samples only)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


class KvserveProcess:
    """Starts `binary --model <default model> --port 0 --metrics-port 0`."""

    def __init__(self, binary, source_dir, *extra, timeout=120, env=None):
        model = os.path.join(source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            raise RuntimeError(f"{model} missing (run deploy/setup.sh)")
        self.model_path = model
        cmd = [binary, "--model", model, "--port", "0",
               "--metrics-port", "0", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env)
        self.output = []
        self.cond = threading.Condition()
        self.eof = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        match = self.wait_for(LISTENING, timeout=timeout)
        if match is None:
            self.kill()
            raise RuntimeError("kvserve did not start:\n" + self.text())
        self.grpc_port = int(match.group(2))
        self.http_port = int(match.group(4))

    def _read(self):
        for line in iter(self.proc.stdout.readline, b""):
            with self.cond:
                self.output.append(line.decode("utf-8", "replace"))
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def text(self):
        with self.cond:
            return "".join(self.output)

    def wait_for(self, pattern, timeout):
        """The first match of `pattern` in the output, waiting up to timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                match = pattern.search("".join(self.output))
                left = deadline - time.monotonic()
                if match or self.eof or left <= 0:
                    return match
                self.cond.wait(left)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.reader.join(timeout=10)  # EOF follows the exit
        self.proc.stdout.close()

    def terminate(self, timeout=120):
        """SIGTERM (the drain flushes the KV tiers), waits for the exit;
        returns its code."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        self.kill()
        return code

    def metrics(self):
        """One scrape of /metrics (plain HTTP), parsed."""
        url = f"http://127.0.0.1:{self.http_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            return parse_metrics(resp.read().decode())

    def wait_metrics(self, pred, timeout=30):
        """Re-scrapes until pred(metrics) holds; returns the last scrape."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if pred(m) or time.monotonic() > deadline:
                return m
            time.sleep(0.05)  # poll interval, not synchronization


class RedisServer:
    """A redis-server on a free port of 127.0.0.1 with a password (also in
    the file `pwfile`, for --kv-remote-cache-password-file), no
    persistence; deploy/setup.sh --test installs it."""

    PASSWORD = "kvserve-test-redis-password"

    def __init__(self, tmp_dir):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.pwfile = os.path.join(tmp_dir, "redis-password")
        with open(self.pwfile, "w") as f:
            f.write(self.PASSWORD + "\n")
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--requirepass", self.PASSWORD, "--save", "", "--appendonly",
             "no", "--logfile", "/dev/null"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.cli("PING").strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def cli(self, *args):
        p = subprocess.run(["redis-cli", "-p", str(self.port),
                            "--no-auth-warning", "-a", self.PASSWORD, *args],
                           capture_output=True, text=True, timeout=30)
        return p.stdout

    def flags(self):
        """kvserve's flags for this store."""
        return ["--kv-remote-cache", f"redis://127.0.0.1:{self.port}",
                "--kv-remote-cache-password-file", self.pwfile]

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
