#!/usr/bin/env python3
"""The paging experiment: paged KV against emulated contiguous slabs.

For each --kv-reservation mode (paged, max-length) this starts the kvserve
binary with the same --kv-cache-bytes and --max-model-len, runs the same
seeded workload through tools/kvserve_bench.py (--json) at each request rate,
and polls /metrics during every run for

  waste     kvserve_kv_reserved_unwritten_slots / kvserve_kv_reserved_slots:
            the fraction of reserved KV token slots holding no token (mean
            over samples with anything reserved, and peak);
  running   kvserve_requests{state="running"}: the concurrency the KV budget
            sustains (peak and mean).

It writes a markdown table (stdout and OUT_DIR/paging_experiment.md), a PNG
chart (OUT_DIR/paging_experiment.png) and the JSON of every run
(OUT_DIR/paging_experiment.json).

Workload (the defaults): bench dataset `sharegpt-synthetic`, lengths
LogNormal with median input 473 (sigma 1.0: mean ~780 tokens) and median
output 15 (sigma 0.8: mean ~21 tokens), so the mean request is ~800 tokens
against max_model_len 8192; seeded, prompts of random token ids (no prefix
hits among them; every rate replays the same seeded requests, so the server runs
with --no-prefix-caching: a later run would otherwise hit the earlier run's
blocks, and max-length slabs share nothing). Outputs are kept short because a small CPU decodes only ~150
tokens/s (and prefills a few hundred). The KV budget (1.6 GB: 2170 blocks of
16 tokens) holds 4 max-length slabs of SmolLM2-135M above the 1% watermark
(fp32 KV: 46,080 bytes/token, 377 MB per 8192-token slab). Rates: 0.25 req/s
(below what this CPU sustains) and inf (all 12 at once: the concurrency the
budget allows).

    tools/paging_experiment.py --binary build/server/kvserve

Needs what tools/kvserve_bench.py needs, plus matplotlib for the chart.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

MODES = ("paged", "max-length")
LISTENING = re.compile(r"kvserve: listening grpc=(\S+):(\d+) http=(\S+):(\d+)")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "server",
                                                    "kvserve"))
    p.add_argument("--model", default=os.path.join(
        ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--kv-cache-bytes", default="1600000000",
                   help="the same KV budget for every mode (default 1.6 GB:"
                        " 4 slabs of 8192 tokens above the 1%% watermark)")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--rates", default="0.25,inf",
                   help="request rates (req/s, or inf), comma-separated")
    p.add_argument("--num-requests", type=int, default=12,
                   help="requests per run (default 12)")
    p.add_argument("--input-len", type=int, default=473,
                   help="median input length (LogNormal sigma 1.0)")
    p.add_argument("--output-len", type=int, default=15,
                   help="median output length (LogNormal sigma 0.8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=240,
                   help="seconds one bench run may take")
    p.add_argument("--poll-interval", type=float, default=0.1)
    p.add_argument("--out-dir", default=os.path.join(ROOT, "docs"))
    return p.parse_args(argv)


def scrape(url):
    """{name or name{labels}: value} of one /metrics scrape."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode("utf-8", "replace")
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


class Poller:
    """Samples waste and running requests from /metrics on a thread."""

    def __init__(self, url, interval):
        self.url, self.interval = url, interval
        self.waste, self.running = [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _loop(self):
        while not self._stop.is_set():
            try:
                m = scrape(self.url)
            except OSError:
                m = {}
            reserved = m.get("kvserve_kv_reserved_slots", 0.0)
            unwritten = m.get("kvserve_kv_reserved_unwritten_slots", 0.0)
            running = m.get('kvserve_requests{state="running"}')
            if reserved > 0:
                self.waste.append(unwritten / reserved)
            if running is not None:
                self.running.append(running)
            self._stop.wait(self.interval)

    def summary(self):
        def mean(xs):
            return sum(xs) / len(xs) if xs else None
        return {"waste_mean": mean(self.waste),
                "waste_peak": max(self.waste) if self.waste else None,
                "running_peak": max(self.running) if self.running else None,
                "running_mean": mean([x for x in self.running if x > 0]),
                "samples": len(self.running)}


def start_server(args, mode):
    cmd = [args.binary, "--model", args.model, "--port", "0",
           "--metrics-port", "0", "--max-model-len", str(args.max_model_len),
           "--kv-cache-bytes", str(args.kv_cache_bytes),
           "--kv-reservation", mode, "--no-prefix-caching",
           "--log-level", "warn"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    log = []
    for line in iter(proc.stdout.readline, ""):
        log.append(line)
        m = LISTENING.search(line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout],
                             daemon=True).start()
            return proc, (f"127.0.0.1:{m.group(2)}",
                          f"http://127.0.0.1:{m.group(4)}/metrics")
    proc.wait()
    sys.exit(f"kvserve ({mode}) did not start:\n{''.join(log)}")


def run_bench(args, target, metrics_url, rate):
    cmd = [sys.executable, os.path.join(HERE, "kvserve_bench.py"),
           "--target", target, "--metrics-url", metrics_url,
           "--dataset", "sharegpt-synthetic", "--input-len",
           str(args.input_len), "--output-len", str(args.output_len),
           "--num-requests", str(args.num_requests), "--request-rate",
           str(rate), "--seed", str(args.seed), "--json", "--no-progress"]
    res = subprocess.run(cmd, capture_output=True, text=True,
                         timeout=args.timeout)
    if res.returncode != 0:
        sys.exit(f"kvserve_bench failed ({res.returncode}):\n{res.stderr}")
    return json.loads(res.stdout)


def run_mode(args, mode, rates):
    proc, (target, metrics_url) = start_server(args, mode)
    runs = []
    try:
        for rate in rates:
            t0 = time.time()
            with Poller(metrics_url, args.poll_interval) as poller:
                bench = run_bench(args, target, metrics_url, rate)
            run = {"mode": mode, "rate": rate, **poller.summary(),
                   "bench": bench}
            runs.append(run)
            print(f"{mode} rate={rate}: {time.time() - t0:.0f}s, waste mean "
                  f"{pct(run['waste_mean'])}, running peak "
                  f"{run['running_peak']}", file=sys.stderr)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return runs


def pct(x):
    return "n/a" if x is None else f"{100 * x:.1f}%"


def ms(b, key, q):
    s = b.get(key)
    return "n/a" if not s else f"{s[q]:.0f}"


def table(runs):
    head = ("| mode | rate (req/s) | KV waste mean | KV waste peak | "
            "running peak | running mean | req/s | output tok/s | "
            "total tok/s | TTFT p50 (ms) | E2E p50 (ms) | E2E p99 (ms) | "
            "preemptions |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in runs:
        b = r["bench"]
        rows.append(
            f"| {r['mode']} | {r['rate']} | {pct(r['waste_mean'])} | "
            f"{pct(r['waste_peak'])} | {r['running_peak']:.0f} | "
            f"{r['running_mean'] or 0:.1f} | "
            f"{b['request_throughput']:.2f} | {b['output_throughput']:.1f} | "
            f"{b['total_token_throughput']:.0f} | {ms(b, 'ttft_ms', 'p50')} | "
            f"{ms(b, 'e2e_ms', 'p50')} | {ms(b, 'e2e_ms', 'p99')} | "
            f"{b['preemptions']} |")
    return "\n".join(rows)


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        x = [str(r["rate"]) for r in rs]
        axes[0].plot(x, [100 * (r["waste_mean"] or 0) for r in rs], "o-",
                     label=mode)
        axes[1].plot(x, [r["running_peak"] for r in rs], "o-", label=mode)
        axes[2].plot(x, [r["bench"]["e2e_ms"]["p50"] / 1000 for r in rs],
                     "o-", label=mode)
    axes[0].set_ylabel("reserved KV holding no token (%, mean)")
    axes[0].set_ylim(0, 100)
    axes[1].set_ylabel("peak running requests")
    axes[1].set_ylim(bottom=0)
    axes[2].set_ylabel("E2E latency p50 (s)")
    for ax in axes:
        ax.set_xlabel("request rate (req/s)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Paged KV vs max-length slabs (same KV budget, "
                 "max_model_len 8192, mean length ~800)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    args = parse_args(argv)
    rates = [x.strip() for x in args.rates.split(",") if x.strip()]
    start = time.time()
    runs = []
    for mode in MODES:
        runs.extend(run_mode(args, mode, rates))
    os.makedirs(args.out_dir, exist_ok=True)
    md = table(runs)
    with open(os.path.join(args.out_dir, "paging_experiment.md"), "w") as f:
        f.write(md + "\n")
    with open(os.path.join(args.out_dir, "paging_experiment.json"), "w") as f:
        json.dump({"config": vars(args), "runs": runs}, f, indent=1)
    plot(runs, os.path.join(args.out_dir, "paging_experiment.png"))
    print(md)
    print(f"\n{time.time() - start:.0f}s; wrote {args.out_dir}/"
          "paging_experiment.{md,json,png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
