"""Test support: a real kvserve process on free ports, its output collected
by a thread (shared by the Python end-to-end tests; not a test itself)."""
import os
import re
import subprocess
import threading
import time

LISTENING = re.compile(r"kvserve: listening grpc=(\S+):(\d+) http=(\S+):(\d+)")


class KvserveProcess:
    """Starts `binary --model <default model> --port 0 --metrics-port 0`."""

    def __init__(self, binary, source_dir, *extra, timeout=120):
        model = os.path.join(source_dir, "weights",
                             "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            raise RuntimeError(f"{model} missing (run deploy/setup.sh)")
        cmd = [binary, "--model", model, "--port", "0",
               "--metrics-port", "0", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
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
