#!/usr/bin/env python3
"""Draws `kvserve sim-replay --timeseries FILE` as a PNG: KV blocks in use
(active and cached) against the pool, running and waiting requests, and the
cumulative preemptions and prefix-cache hits, over the replay's time.

    tools/plot_sim_replay.py replay.csv replay.png [--title TEXT]

Needs matplotlib (requirements-bench.txt; deploy/setup.sh --bench).
"""
import argparse
import csv
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("png")
    p.add_argument("--title", default="kvserve sim-replay")
    args = p.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_sim_replay: {e} (pip install -r requirements-bench.txt)",
              file=sys.stderr)
        return 1
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"plot_sim_replay: {args.csv} has no samples", file=sys.stderr)
        return 1
    col = {k: [float(r[k]) for r in rows] for k in rows[0]}
    t = col["time_s"]
    fig, (kv, queue, events) = plt.subplots(3, 1, sharex=True,
                                            figsize=(10, 8))
    kv.stackplot(t, col["blocks_active"], col["blocks_cached"],
                 labels=["active", "cached (evictable)"], alpha=0.8)
    kv.plot(t, col["blocks_total"], "k--", lw=1, label="pool")
    kv.set_ylabel("KV blocks")
    kv.legend(loc="upper left")
    queue.plot(t, col["running"], label="running")
    queue.plot(t, col["waiting"], label="waiting")
    queue.set_ylabel("requests")
    queue.legend(loc="upper left")
    events.plot(t, col["preemptions"], label="preemptions")
    events.set_ylabel("preemptions (cumulative)")
    hits = events.twinx()
    hits.plot(t, col["cached_tokens"], color="tab:green",
              label="prefix-cache hit tokens")
    hits.set_ylabel("hit tokens (cumulative)")
    events.legend(loc="upper left")
    hits.legend(loc="lower right")
    events.set_xlabel("time (s)")
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
