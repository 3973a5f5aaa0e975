#!/usr/bin/env python3
"""Speculative decoding against none, at batch 1: tokens per second of one
greedy completion, a server with --speculative off and one with ngram side
by side (one runs while the other idles), interleaved A/B then B/A for
--repeats rounds after a warm-up; medians and ranges per prompt.

Prompts: "copy" (a passage the default model copies, a grounded task where
prompt lookup drafts are accepted) and "open" (open-ended text, where they
rarely are: the cost side). The outputs of both servers must be equal
(speculation never changes them); a difference fails the run.

    tools/spec_bench.py --binary build/server/kvserve --source-dir . [--repeats 5]

Measures neither llama-server with its n-gram speculation, nor batches
above 1, nor a draft model.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "server"))
import speculative_e2e_test as spec  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    spec.ARGS = args
    spec.MAX_TOKENS = args.max_tokens
    prompts = {"copy": spec.PROMPTS[0], "open": spec.PROMPTS[2]}
    servers = {m: spec.Server("--speculative", m) for m in ("off", "ngram")}
    rates, texts = {}, {}
    try:
        for s in servers.values():
            for p in prompts.values():
                s.complete(p[1], p[2])  # warm-up
        for rep in range(args.repeats):
            order = ("off", "ngram") if rep % 2 == 0 else ("ngram", "off")
            for mode in order:
                for name, p in prompts.items():
                    t0 = time.monotonic()
                    out = servers[mode].complete(p[1], p[2])
                    dt = time.monotonic() - t0
                    n = out["usage"]["completion_tokens"]
                    rates.setdefault((name, mode), []).append(n / dt)
                    texts.setdefault((name, mode), set()).add(
                        out["choices"][0]["text"])
    finally:
        for s in servers.values():
            s.close()
    ok = True
    for name in prompts:
        if texts[(name, "off")] != texts[(name, "ngram")]:
            print(f"{name}: outputs differ", file=sys.stderr)
            ok = False
        off = sorted(rates[(name, "off")])
        on = sorted(rates[(name, "ngram")])
        med = lambda v: v[len(v) // 2]  # noqa: E731
        print(f"{name:5s} off   {med(off):7.1f} tok/s ({off[0]:.1f}-{off[-1]:.1f})"
              f"   ngram {med(on):7.1f} tok/s ({on[0]:.1f}-{on[-1]:.1f})"
              f"   ratio {med(on) / med(off):.2f}x")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
