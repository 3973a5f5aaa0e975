#!/usr/bin/env python3
"""Head-of-line blocking: a short request's time to first token while a
long prompt prefills, against its idle time to first token, for several
--long-prefill-token-threshold values (one kvserve per value, same flags).

    tools/hol_bench.py --binary build/server/kvserve \
        --model weights/SmolLM2-135M-Instruct.Q4_1.gguf --thresholds 0,256,128

The long request is a ~N-token prompt with max_tokens 1; the short one (a
few tokens, max_tokens 1) is sent `--delay` seconds after it. Prints one
row per threshold: idle TTFT of the short request (median of 3), its TTFT
under the long prefill (median of `--runs`), and the long request's TTFT.
"""

import argparse
import http.client
import json
import re
import statistics
import subprocess
import threading
import time


def ttft(port, prompt, result, key):
    """Streams one completion; stores seconds to its first data event."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body=json.dumps({
        "prompt": prompt, "max_tokens": 1, "temperature": 0,
        "ignore_eos": True, "stream": True}),
        headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:300]}")
    first = None
    for line in resp:
        if line.startswith(b"data: ") and first is None:
            first = time.perf_counter() - t0
        if line.startswith(b"data: [DONE]"):
            break
    conn.close()
    result[key] = first


def start(binary, model, threshold, threads):
    proc = subprocess.Popen(
        [binary, "--model", model, "--port", "0", "--metrics-port", "0",
         "--threads", str(threads), "--long-prefill-token-threshold",
         str(threshold), "--kv-cache-bytes", "512MiB",
         "--no-prefix-caching"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    port = None
    for line in proc.stdout:
        m = re.search(r"kvserve: listening grpc=\S+:\d+ http=\S+:(\d+)",
                      line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise RuntimeError("kvserve exited before listening")
    threading.Thread(target=lambda: [None for _ in proc.stdout],
                     daemon=True).start()
    return proc, port


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--thresholds", default="0,256,128")
    ap.add_argument("--long-words", type=int, default=1800)
    ap.add_argument("--delay", type=float, default=0.5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    short = "Hello there"
    print("| --long-prefill-token-threshold | short TTFT idle (s) | short TTFT "
          "under a long prefill (s) | ratio | long TTFT (s) |")
    print("|---|---|---|---|---|")
    for threshold in [int(t) for t in args.thresholds.split(",")]:
        proc, port = start(args.binary, args.model, threshold, args.threads)
        try:
            idle = []
            for i in range(3):
                r = {}
                ttft(port, f"{short} {i}", r, "s")
                idle.append(r["s"])
            busy, long_t = [], []
            for i in range(args.runs):
                # A fresh prompt each run: nothing comes from a cache.
                long_prompt = " ".join(
                    f"word{(i * 7919 + k) % 5000}"
                    for k in range(args.long_words))
                r = {}
                t = threading.Thread(target=ttft,
                                     args=(port, long_prompt, r, "long"))
                t.start()
                time.sleep(args.delay)
                ttft(port, f"{short} {i}", r, "short")
                t.join()
                busy.append(r["short"])
                long_t.append(r["long"])
            i_med, b_med = statistics.median(idle), statistics.median(busy)
            print(f"| {threshold} | {i_med:.3f} | {b_med:.3f} | "
                  f"{b_med / i_med:.1f} | {statistics.median(long_t):.2f} |",
                  flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
