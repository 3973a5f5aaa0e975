#!/usr/bin/env python3
"""What structured output costs: constrained against unconstrained decoding,
in one run, on one daemon (the default model unless --model).

Two points, each A B B A over --rounds (A: unconstrained, B: a JSON
schema; with --overlap, A B C C B A where C is the schema on a second
daemon run with --structured-output-overlap), streamed over the OpenAI
API (tools/sse_client.py):
  batch 1     --batch1-requests requests one at a time; time per output
              token (TPOT: from the first streamed token to the last, over
              the tokens after the first chunk), median per run
  32 streams  --streams concurrent requests; output tokens per second of
              the wave (all tokens over its wall time)
Every request produces exactly --tokens tokens: the schema is one string
property whose minLength (4 x --tokens characters) outlasts them, and the
unconstrained request ignores the end of sequence, so both decode the same
count of tokens from the same prompt; greedy (temperature 0), as JSON
clients usually ask. Prints each run, then min / median / max per mode and
the ratios B / A (the issue's goals: batch 1 TPOT <= 1.05x, 32 streams
throughput >= 0.95x).

    tools/structured_output_bench.py --rounds 5
"""
import argparse
import asyncio
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
import sse_client  # noqa: E402
from kvserve_process import KvserveProcess  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper, as JSON."


def body(constrained, tokens, stream_id):
    b = {"messages": [{"role": "user",
                       "content": f"{PROMPT} (#{stream_id})"}],
         "max_tokens": tokens, "temperature": 0, "stream": True,
         "return_token_ids": True}
    if constrained:
        b["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "story", "strict": True, "schema": {
                "type": "object", "properties": {"story": {
                    "type": "string", "minLength": 4 * tokens}},
                "required": ["story"], "additionalProperties": False}}}
    else:
        b["ignore_eos"] = True
    return b


async def one(port, constrained, tokens, stream_id):
    stamps = []  # (time, tokens in the chunk)
    async for t, data in sse_client.stream_events(
            "127.0.0.1", port, "/v1/chat/completions",
            body(constrained, tokens, stream_id)):
        if data == "[DONE]":
            break
        ev = json.loads(data)
        for c in ev.get("choices", []):
            n = len(c.get("token_ids") or [])
            if n:
                stamps.append((t, n))
    total = sum(n for _, n in stamps)
    if total != tokens:
        raise RuntimeError(f"{total} tokens, wanted {tokens}")
    after_first = total - stamps[0][1]
    tpot = (stamps[-1][0] - stamps[0][0]) / max(after_first, 1)
    return tpot, total


async def batch1(port, constrained, args):
    tpots = []
    for i in range(args.batch1_requests):
        tpot, _ = await one(port, constrained, args.tokens, i)
        tpots.append(tpot)
    return statistics.median(tpots)


async def streams(port, constrained, args):
    t0 = time.perf_counter()
    res = await asyncio.gather(*[
        one(port, constrained, args.tokens, i) for i in range(args.streams)])
    return sum(n for _, n in res) / (time.perf_counter() - t0)


def summary(values):
    return (f"{min(values):.4g} / {statistics.median(values):.4g} / "
            f"{max(values):.4g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "server",
                                                     "kvserve"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--batch1-requests", type=int, default=4)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--overlap", action="store_true",
                    help="also the schema on a --structured-output-overlap "
                         "daemon")
    args = ap.parse_args()
    extra = ["--threads", args.threads, "--kv-cache-bytes", "512MiB"]
    if args.model:
        extra = ["--model", args.model] + extra
    server = KvserveProcess(args.binary, ROOT, *extra)
    servers = [server]
    modes = [("plain ", server, False), ("schema", server, True)]
    try:
        if args.overlap:
            servers.append(KvserveProcess(args.binary, ROOT, *extra,
                                          "--structured-output-overlap"))
            modes.append(("overlap", servers[1], True))
        # Warm-up: the schema compiles once (cached after) and the pages of
        # the weights are touched.
        for _, s, constrained in modes:
            asyncio.run(one(s.http_port, constrained, args.tokens, 0))
        res = {name: {"b1": [], "s": []} for name, _, _ in modes}
        for r in range(args.rounds):
            for name, s, constrained in modes + modes[::-1]:
                b1 = asyncio.run(batch1(s.http_port, constrained, args))
                tput = asyncio.run(streams(s.http_port, constrained, args))
                res[name]["b1"].append(b1)
                res[name]["s"].append(tput)
                print(f"round {r + 1} {name}  batch-1 TPOT {b1 * 1e3:.2f} ms"
                      f"   {args.streams} streams {tput:.1f} tok/s",
                      flush=True)
        m = server.metrics()
    finally:
        for s in servers:
            s.terminate()
    masks = m.get("kvserve_structured_output_masks_total", 0)
    mask_s = m.get("kvserve_structured_output_mask_seconds_total", 0)
    print(f"\n{args.rounds} ABBA rounds, {args.tokens} tokens per request; "
          "min / median / max")
    for name, _, _ in modes:
        r = res[name]
        print(f"{name}  batch-1 TPOT ms "
              f"{summary([x * 1e3 for x in r['b1']])}   {args.streams} "
              f"streams tok/s {summary(r['s'])}")
    for name, _, _ in modes[1:]:
        b1 = [b / a for a, b in zip(res["plain "]["b1"], res[name]["b1"])]
        s = [b / a for a, b in zip(res["plain "]["s"], res[name]["s"])]
        print(f"{name} / plain (paired by position): batch-1 TPOT "
              f"{summary(b1)} (goal <= 1.05); {args.streams} streams "
              f"throughput {summary(s)} (goal >= 0.95)")
    if masks:
        print(f"engine-thread mask + accept per token (mean): "
              f"{mask_s / masks * 1e6:.1f} us over {int(masks)} masks")


if __name__ == "__main__":
    main()
