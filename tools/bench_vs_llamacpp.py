#!/usr/bin/env python3
"""Prefill and batch-1 decode throughput: kvserve vs llama.cpp on the same
GGUF file and machine, measured in the same run, reported as ratios.

kvserve: `kvserve generate` (greedy, --ignore-eos), which prints prefill and
decode tokens/s. llama.cpp: llama-cpp-python (deploy/setup.sh --bench), timing
llama_eval of the prompt (prefill) and of one token at a time (decode).
Both use the same thread count. Each measurement repeats --reps times,
interleaved, and the median is reported.

With --streams N1,N2,... it measures aggregate throughput at N concurrent
streams instead (tools/bench_batched.py): kvserve through the real server
(the kvserve daemon, driven by tools/kvserve_bench.py --concurrency N with
ignore_eos) against llama.cpp's own multi-sequence batched decoding
(llama_batch with N sequences, n_seq_max = N), same prompts, lengths,
threads and GGUF.

Usage: tools/bench_vs_llamacpp.py [--binary build/server/kvserve]
       [--model weights/SmolLM2-135M-Instruct.Q4_1.gguf] [--prompt-tokens 256]
       [--decode-tokens 128] [--threads 2] [--reps 3] [--json]
       [--streams 1,4,16,32 [--input-len 64] [--output-len 128]]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the quick brown fox jumps over the lazy dog while a gentle river "
         "flows past old stone bridges and quiet green fields ").split()


def make_prompt(n_words):
    return " ".join(WORDS[i % len(WORDS)] for i in range(n_words))


def run_kvserve(args, prompt):
    cmd = [args.binary, "generate", "--model", args.model, "--prompt", prompt,
           "--no-chat", "--temperature", "0", "--ignore-eos",
           "--max-tokens", str(args.decode_tokens),
           "--threads", str(args.threads),
           "--kv-cache-dtype", "fp16"]  # llama.cpp's default KV type
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    pre = re.search(r"prefill: (\d+) tokens in [\d.]+ s \(([\d.]+) tokens/s",
                    out.stderr)
    dec = re.search(r"decode: (\d+) tokens in [\d.]+ s \(([\d.]+) tokens/s",
                    out.stderr)
    return int(pre.group(1)), float(pre.group(2)), float(dec.group(2))


def run_llamacpp(llm, prompt, decode_tokens):
    ids = llm.tokenize(prompt.encode(), add_bos=False, special=False)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    import numpy as np
    for _ in range(decode_tokens):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        llm.eval([tok])
    t2 = time.perf_counter()
    return len(ids), len(ids) / (t1 - t0), decode_tokens / (t2 - t1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=os.path.join(ROOT, "build/server/kvserve"))
    p.add_argument("--model", default=os.path.join(
        ROOT, "weights/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--streams", default=None, metavar="N1,N2,...",
                   help="aggregate throughput at these stream counts")
    p.add_argument("--input-len", type=int, default=64,
                   help="--streams: prompt tokens per stream")
    p.add_argument("--output-len", type=int, default=128,
                   help="--streams: generated tokens per stream")
    p.add_argument("--kv-unified", action="store_true",
                   help="--streams: llama.cpp one KV buffer for all sequences "
                   "(default: one per sequence)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"),
                   default="auto", help="--streams: llama.cpp flash attention")
    args = p.parse_args()
    if args.streams:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_batched
        return bench_batched.main(args)
    import llama_cpp
    n_ctx = args.prompt_tokens * 2 + args.decode_tokens + 64
    llm = llama_cpp.Llama(model_path=args.model, n_ctx=n_ctx, n_batch=n_ctx,
                          n_threads=args.threads, n_threads_batch=args.threads,
                          logits_all=False, verbose=False)
    # ~1.1 tokens per word for this text; trim to the requested count.
    prompt = make_prompt(args.prompt_tokens)
    ids = llm.tokenize(prompt.encode(), add_bos=False)[:args.prompt_tokens]
    prompt = llm.detokenize(ids).decode()
    kv, lc = [], []
    for _ in range(args.reps):
        kv.append(run_kvserve(args, prompt))
        lc.append(run_llamacpp(llm, prompt, args.decode_tokens))
    res = {
        "prompt_tokens": kv[0][0], "decode_tokens": args.decode_tokens,
        "threads": args.threads, "reps": args.reps,
        "kvserve_prefill_tps": statistics.median(r[1] for r in kv),
        "kvserve_decode_tps": statistics.median(r[2] for r in kv),
        "llamacpp_prefill_tps": statistics.median(r[1] for r in lc),
        "llamacpp_decode_tps": statistics.median(r[2] for r in lc),
    }
    res["prefill_ratio"] = res["kvserve_prefill_tps"] / res["llamacpp_prefill_tps"]
    res["decode_ratio"] = res["kvserve_decode_tps"] / res["llamacpp_decode_tps"]
    if args.json:
        print(json.dumps(res))
        return
    print(f"prompt {res['prompt_tokens']} tokens, decode {args.decode_tokens} "
          f"tokens, {args.threads} threads, median of {args.reps}")
    print(f"{'':10}{'kvserve':>12}{'llama.cpp':>12}{'ratio':>8}")
    for k in ("prefill", "decode"):
        print(f"{k + ' t/s':10}{res['kvserve_' + k + '_tps']:12.1f}"
              f"{res['llamacpp_' + k + '_tps']:12.1f}{res[k + '_ratio']:8.2f}")


if __name__ == "__main__":
    sys.exit(main())
