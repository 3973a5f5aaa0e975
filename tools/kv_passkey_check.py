#!/usr/bin/env python3
"""Retrieval under bounded KV: a pass key stated at the start of a long
filler text, asked for at the end (the passkey task of Mohtashami and Jaggi,
2023), answered greedily with the full cache and under kv_policy streaming
windows (and heavy_hitters with --heavy-hitters-window), at several prompt
lengths and key values.

The full cache must retrieve it first (else the model cannot do the task at
that length and the policies are not compared). A window drops the key
unless its sinks cover it: `--sinks-cover` adds a policy whose sinks span
the instruction and the key, as a system prompt would be kept.

    tools/kv_passkey_check.py --binary build/server/kvserve --source-dir . \\
        --lengths 1000,2000,4000 --keys 5 --window 512

Prints one line per (length, policy): keys retrieved of --keys; --out writes
the same as JSON.
"""

import argparse
import json
import os
import random
import sys
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "server"))
from kvserve_process import KvserveProcess  # noqa: E402

HEAD = ("There is an important piece of information hidden inside a lot of "
        "irrelevant text. Find it and memorize it. I will quiz you about it. "
        "The pass key is {key}. Remember it. {key} is the pass key.\n")
FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we "
          "go. There and back again. ")
TAIL = "\nWhat is the pass key? The pass key is"


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)


def count_tokens(port, text):
    d = post(port, "/v1/completions", {"prompt": text, "max_tokens": 1})
    return d["usage"]["prompt_tokens"]


def prompt_of(port, key, length):
    """HEAD + filler + TAIL of about `length` tokens."""
    head, tail = HEAD.format(key=key), TAIL
    per = count_tokens(port, FILLER * 10) / 10
    n = max(0, int((length - count_tokens(port, head + tail)) / per))
    return head + FILLER * n + tail


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--source-dir", required=True)
    p.add_argument("--lengths", default="1000,2000,4000")
    p.add_argument("--keys", type=int, default=5)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--heavy-hitters-window", type=int, default=0,
                   help="also run heavy_hitters (sinks 4, this recent "
                   "window, the streaming policy's budget); 0: not run")
    p.add_argument("--out")
    a = p.parse_args()
    server = KvserveProcess(a.binary, a.source_dir, "--threads", "2",
                            "--max-model-len", "8192", "--no-prefix-caching")
    rng = random.Random(a.seed)
    keys = [str(rng.randint(10000, 99999)) for _ in range(a.keys)]
    head_tokens = count_tokens(server.http_port, HEAD.format(key=keys[0]))
    policies = {
        "full": None,
        f"sinks 4, window {a.window}":
            {"type": "streaming", "sinks": 4, "window": a.window},
        f"sinks {head_tokens} (the key), window {a.window}":
            {"type": "streaming", "sinks": head_tokens, "window": a.window},
    }
    if a.heavy_hitters_window:
        # The same peak KV as the first window: its sink block + window.
        budget = 16 + a.window
        policies[f"heavy hitters, window {a.heavy_hitters_window}, budget "
                 f"{budget}"] = {"type": "heavy_hitters", "sinks": 4,
                                 "window": a.heavy_hitters_window,
                                 "budget": budget}
    rows = []
    try:
        for length in [int(x) for x in a.lengths.split(",")]:
            for name, policy in policies.items():
                hits, tokens = 0, 0
                for key in keys:
                    prompt = prompt_of(server.http_port, key, length)
                    body = {"prompt": prompt, "max_tokens": 8,
                            "temperature": 0}
                    if policy:
                        body["kv_policy"] = policy
                    d = post(server.http_port, "/v1/completions", body)
                    hits += key in d["choices"][0]["text"]
                    tokens = d["usage"]["prompt_tokens"]
                rows.append({"prompt_tokens": tokens, "policy": name,
                             "retrieved": hits, "keys": len(keys)})
                print(f"{tokens:6d} tokens  {name:32s} {hits}/{len(keys)}",
                      flush=True)
    finally:
        server.kill()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
