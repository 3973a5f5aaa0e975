#!/usr/bin/env python3
"""Opens many concurrent SSE streams against POST /v1/completions and reports
how the HTTP server copes: streams completed, errors by kind, time to first
event (TTFT) and stream duration percentiles, and the server's peak thread
count and RSS (read from /proc/PID/status every 50 ms).

Used to choose kvserve's HTTP library by a load test with 1,000 concurrent
streams (the prototypes it compared, cpp-httplib and
Boost.Beast serving the same synthetic events, were removed after the choice:
docs/PERFORMANCE.md). Target: kvserve's --http-port, started by --spawn so
the tool knows the server's PID, or an address and a PID:

    tools/http_stream_loadtest.py --streams 1000 --spawn \\
        "build/server/kvserve --port 0 --http-port 0 --http-threads 1"
    tools/http_stream_loadtest.py --streams 1000 --target 127.0.0.1:9090 \\
        --pid $(pidof kvserve)

--spawn runs the command, waits for a line with `listening HOST:PORT` or
`http=HOST:PORT` on its stdout/stderr, and stops it afterwards. All streams
are opened at once (one TCP connection each, no keep-alive; --ramp-s spreads
them out); each request is
{"prompt": [token ids], "max_tokens": --max-tokens, "stream": true,
"ignore_eos": true}. Loopback targets only. Needs only the standard library
(tools/sse_client.py).
"""

import argparse
import asyncio
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sse_client  # noqa: E402
from kvserve_bench import (UsageError, check_loopback,  # noqa: E402
                           split_host_port)

LISTEN = re.compile(r"http=(\S+):(\d+)|listening ([^\s=]+):(\d+)")


def percentile(values, q):
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return 1000.0 * (s[lo] + (s[hi] - s[lo]) * (k - lo))


class ProcSampler(threading.Thread):
    """Peak Threads and VmRSS of a PID, sampled every 50 ms."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_threads, self.peak_rss_kb = pid, 0, 0
        self.start_threads = self.start_rss_kb = None
        self._halt = threading.Event()

    def sample(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                text = f.read()
        except OSError:
            return
        th = int(re.search(r"^Threads:\s+(\d+)", text, re.M).group(1))
        rss = int(re.search(r"^VmRSS:\s+(\d+)", text, re.M).group(1))
        if self.start_threads is None:
            self.start_threads, self.start_rss_kb = th, rss
        self.peak_threads = max(self.peak_threads, th)
        self.peak_rss_kb = max(self.peak_rss_kb, rss)

    def run(self):
        while not self._halt.wait(0.05):
            self.sample()

    def stop(self):
        self._halt.set()
        self.join()
        self.sample()


async def one_stream(args, idx, t0, results):
    if args.ramp_s > 0:
        await asyncio.sleep(args.ramp_s * idx / args.streams)
    body = {"model": args.model, "prompt": [(idx * 7 + j) % 1000 + 100
                                            for j in range(args.prompt_len)],
            "max_tokens": args.max_tokens, "stream": True,
            "ignore_eos": True, "temperature": 0}
    if args.model is None:
        del body["model"]
    rec = {"ttft": None, "dur": None, "events": 0, "error": None}
    start = time.perf_counter()
    try:
        async with asyncio.timeout(args.timeout):
            async for now, data in sse_client.stream_events(
                    args.host, args.port, "/v1/completions", body,
                    connect_timeout=args.timeout):
                if rec["ttft"] is None:
                    rec["ttft"] = now - start
                if data == "[DONE]":
                    rec["done"] = True
                    break
                if '"error"' in data and json.loads(data).get("error"):
                    rec["error"] = "stream_error"
                    break
                rec["events"] += 1
        if rec["error"] is None and not rec.get("done"):
            rec["error"] = "no_[DONE]"
    except TimeoutError:
        rec["error"] = "timeout"
    except sse_client.HttpError as e:
        rec["error"] = f"http_{e.status}"
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        rec["error"] = type(e).__name__
    rec["dur"] = time.perf_counter() - start
    rec["start_offset"] = start - t0
    results.append(rec)


async def run(args):
    results = []
    t0 = time.perf_counter()
    await asyncio.gather(*(one_stream(args, i, t0, results)
                           for i in range(args.streams)))
    return results, time.perf_counter() - t0


def spawn(cmd):
    proc = subprocess.Popen(shlex.split(cmd), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    log = []
    for line in iter(proc.stdout.readline, ""):
        log.append(line)
        m = LISTEN.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout],
                             daemon=True).start()
            host, port = (m.group(1), m.group(2)) if m.group(1) else \
                (m.group(3), m.group(4))
            return proc, f"{host}:{port}"
        if time.time() > deadline:
            break
    proc.kill()
    raise UsageError(f"--spawn: no 'listening HOST:PORT' from {cmd!r}:\n" +
                     "".join(log[-20:]))


def main(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="HOST:PORT of the HTTP server (loopback)")
    p.add_argument("--spawn", help="command that starts the server (see above)")
    p.add_argument("--pid", type=int, help="server PID for threads/RSS")
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=8)
    p.add_argument("--model", default=None, help="model field (default none)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="per-stream limit in seconds (default %(default)s)")
    p.add_argument("--ramp-s", type=float, default=0.0,
                   help="spread the connection starts evenly over this many "
                   "seconds (default 0: all at once)")
    p.add_argument("--label", default="", help="name for the result")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    proc = None
    try:
        if (args.target is None) == (args.spawn is None):
            raise UsageError("give exactly one of --target and --spawn")
        if args.streams < 1 or args.max_tokens < 1 or args.prompt_len < 1:
            raise UsageError("--streams, --max-tokens, --prompt-len: >= 1")
        need = args.streams + 64
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < need:
            if hard != resource.RLIM_INFINITY and hard < need:
                raise UsageError(f"--streams {args.streams} needs {need} file "
                                 f"descriptors; the hard limit is {hard}")
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        if args.spawn:
            proc, args.target = spawn(args.spawn)
            args.pid = proc.pid
        args.host, args.port = split_host_port(args.target)
        check_loopback("--target", args.host)
        sampler = ProcSampler(args.pid) if args.pid else None
        if sampler:
            sampler.sample()
            sampler.start()
        results, wall = asyncio.run(run(args))
        if sampler:
            sampler.stop()
    except UsageError as e:
        print(f"http_stream_loadtest: error: {e}", file=sys.stderr)
        return 2
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    ok = [r for r in results if r["error"] is None]
    errors = {}
    for r in results:
        if r["error"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    ttft = [r["ttft"] for r in ok]
    dur = [r["dur"] for r in ok]
    out = {"label": args.label or args.spawn or args.target,
           "streams": args.streams, "completed": len(ok), "errors": errors,
           "wall_s": wall, "max_tokens": args.max_tokens,
           "ttft_ms": {f"p{q}": percentile(ttft, q) for q in (50, 90, 99)},
           "stream_ms": {f"p{q}": percentile(dur, q) for q in (50, 90, 99)},
           "ttft_max_ms": max(ttft) * 1000 if ttft else None}
    if sampler:
        out.update({"server_threads_idle": sampler.start_threads,
                    "server_threads_peak": sampler.peak_threads,
                    "server_rss_idle_mib": sampler.start_rss_kb / 1024,
                    "server_rss_peak_mib": sampler.peak_rss_kb / 1024})
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>22}: {v}")
    return 0 if len(ok) == args.streams else 1


if __name__ == "__main__":
    sys.exit(main())
