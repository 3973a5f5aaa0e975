#!/usr/bin/env python3
"""Start-to-listening time of kvserve binaries, interleaved.

Starts each binary as `BINARY --model MODEL --port 0 --metrics-port 0
[EXTRA...]`, times from the spawn to its `kvserve: listening` line, and
stops it (SIGTERM). Binaries alternate within each repetition, so a noisy
machine affects them alike. Prints one line per run and the median per
binary; also the daemon's peak resident memory at that moment (VmHWM).

    tools/startup_bench.py --binary build/server/kvserve \
        --binary /tmp/before/build/server/kvserve --reps 5 [-- EXTRA FLAGS]
"""

import argparse
import re
import signal
import statistics
import subprocess
import sys
import time

LISTENING = re.compile(rb"kvserve: listening")


def peak_rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def one_start(binary, model, extra, timeout):
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [binary, "--model", model, "--port", "0", "--metrics-port", "0",
         *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out = b""
        while time.monotonic() - t0 < timeout:
            line = proc.stdout.readline()
            if not line:
                break
            out += line
            if LISTENING.search(line):
                dt = time.monotonic() - t0
                return dt, peak_rss_mib(proc.pid)
        raise RuntimeError(f"{binary} did not listen:\n{out.decode()}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", action="append", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120)
    args, extra = ap.parse_known_args()
    if extra and extra[0] == "--":
        extra = extra[1:]
    times = {b: [] for b in args.binary}
    for rep in range(args.reps):
        for b in args.binary:
            dt, rss = one_start(b, args.model, extra, args.timeout)
            times[b].append(dt)
            print(f"rep {rep}: {b}: {dt:.2f} s to listening, "
                  f"peak RSS {rss:.0f} MiB", flush=True)
    for b, ts in times.items():
        print(f"median {statistics.median(ts):.2f} s  "
              f"(min {min(ts):.2f}, max {max(ts):.2f}, n={len(ts)})  {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
