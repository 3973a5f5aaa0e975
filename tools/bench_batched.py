"""Aggregate throughput at N concurrent streams: kvserve vs llama.cpp.

Used by `tools/bench_vs_llamacpp.py --streams 1,4,16,32`. For each N, in the
same run and interleaved over --reps:

  kvserve    the real daemon (started once: --threads T, gRPC + HTTP on free
             loopback ports), driven by tools/kvserve_bench.py --concurrency N
             --num-requests N --request-rate inf (fixed dataset, ignore_eos),
             i.e. N streams that start together and each generate exactly
             --output-len tokens after an --input-len token prompt.
  llama.cpp  llama-cpp-python's low-level API: one context with n_seq_max = N
             (one KV stream per sequence unless --kv-unified), all N prompts
             prefilled in one llama_batch (logits on each last token), then
             --output-len - 1 decode steps of one llama_batch of N tokens, one
             per seq_id, greedy (argmax of each row's logits).

Both get the same prompts (the token ids kvserve_bench.py draws for --seed 0),
the same GGUF, the same thread count. Reported per N: output tokens/s over
the whole run (prefill included) and over the decode phase alone, and their
kvserve / llama.cpp ratios (median of --reps).

The bench client runs on the same cores as kvserve (it is part of serving
through the real server); llama.cpp runs in this process with no client.
"""

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LISTENING = re.compile(r"kvserve: listening grpc=(\S+):(\d+) http=(\S+):(\d+)")


def parse_streams(text):
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit() or int(part) < 1:
            raise SystemExit(f"--streams: expected positive integers, got "
                             f"{part!r}")
        out.append(int(part))
    return out


def prompts_for(n, input_len, output_len, vocab, max_context):
    """The exact prompts kvserve_bench.py sends for --seed 0, fixed dataset."""
    import numpy as np
    import kvserve_bench

    ns = argparse.Namespace(num_requests=n, dataset="fixed", input_len=input_len,
                            output_len=output_len)
    work = kvserve_bench.make_workload(ns, vocab, max_context,
                                       np.random.default_rng(0))
    return [w[0] for w in work]


# ------------------------------------------------------------------ kvserve


class Server:
    def __init__(self, args, max_seqs):
        cmd = [args.binary, "--model", args.model, "--port", "0",
               "--metrics-port", "0", "--threads", str(args.threads),
               "--max-num-seqs", str(max(64, max_seqs)),
               "--max-model-len", str(args.input_len + args.output_len + 64),
               "--kv-cache-bytes", "512MiB", "--log-level", "warn",
               # llama.cpp's default KV type, for a like-for-like comparison
               "--kv-cache-dtype", "fp16"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.log = []
        m = None
        for line in iter(self.proc.stdout.readline, ""):
            self.log.append(line)
            m = LISTENING.search(line)
            if m:
                break
        if m is None:
            self.proc.kill()
            raise SystemExit("kvserve did not start:\n" + "".join(self.log))
        threading.Thread(target=lambda: [self.log.append(x) for x in
                                         iter(self.proc.stdout.readline, "")],
                         daemon=True).start()
        self.target = f"127.0.0.1:{m.group(2)}"
        self.metrics = f"http://127.0.0.1:{m.group(4)}/metrics"

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def run_kvserve(args, server, n):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "kvserve_bench.py"),
           "--target", server.target, "--metrics-url", server.metrics,
           "--num-requests", str(n), "--concurrency", str(n),
           "--request-rate", "inf", "--input-len", str(args.input_len),
           "--output-len", str(args.output_len), "--seed", "0", "--json",
           "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    if r["completed"] != n or r["total_output_tokens"] != n * args.output_len:
        raise SystemExit(f"kvserve run incomplete: {out.stdout}")
    tpot = r["tpot_ms"]["mean"] / 1000.0
    return {"tps": r["output_throughput"], "decode_tps": n / tpot,
            "ttft_p50_ms": r["ttft_ms"]["p50"], "wall_s": r["duration_s"]}


# ---------------------------------------------------------------- llama.cpp


class LlamaBatched:
    """One llama.cpp context sized for n sequences."""

    def __init__(self, args, n):
        import llama_cpp as L

        from llama_cpp import _logger

        _logger.set_verbose(False)
        self.L, self.n = L, n
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(args.model.encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp cannot load {args.model}")
        per_seq = args.input_len + args.output_len + 16
        cp = L.llama_context_default_params()
        cp.n_ctx = per_seq * n
        cp.n_batch = max(per_seq * n, 512)
        cp.n_ubatch = 512
        cp.n_seq_max = n
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.kv_unified = bool(args.kv_unified)
        cp.flash_attn_type = {"auto": -1, "off": 0, "on": 1}[args.flash_attn]
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp cannot create the context")
        self.vocab = L.llama_vocab_n_tokens(
            L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(cp.n_batch, 0, 1)

    def close(self):
        L = self.L
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def _fill(self, items):
        """items: (token, pos, seq, want_logits)."""
        b = self.batch
        b.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = logits

    def _argmax(self, idx):
        import numpy as np

        ptr = self.L.llama_get_logits_ith(self.ctx, idx)
        row = np.ctypeslib.as_array(ptr, shape=(self.vocab,))
        return int(row.argmax())

    def run(self, prompts, output_len):
        """Returns (wall s, decode-phase s) for n streams of output_len."""
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        t0 = time.perf_counter()
        items, last = [], []
        for s, p in enumerate(prompts):
            for j, tok in enumerate(p):
                items.append((tok, j, s, j == len(p) - 1))
            last.append(len(items) - 1)
        self._fill(items)
        if L.llama_decode(self.ctx, self.batch) != 0:
            raise SystemExit("llama_decode (prefill) failed")
        toks = [self._argmax(i) for i in last]
        t1 = time.perf_counter()
        for step in range(1, output_len):
            self._fill([(toks[s], len(prompts[s]) + step - 1, s, True)
                        for s in range(len(prompts))])
            if L.llama_decode(self.ctx, self.batch) != 0:
                raise SystemExit(f"llama_decode failed at step {step}")
            toks = [self._argmax(i) for i in range(len(prompts))]
        t2 = time.perf_counter()
        return t2 - t0, t2 - t1


def run_llamacpp(lc, prompts, output_len):
    n = len(prompts)
    wall, dec = lc.run(prompts, output_len)
    return {"tps": n * output_len / wall,
            "decode_tps": n * (output_len - 1) / dec if dec > 0 else 0.0,
            "wall_s": wall}


# --------------------------------------------------------------------- main


def main(args):
    streams = parse_streams(args.streams)
    if args.input_len < 1 or args.output_len < 2:
        raise SystemExit("--input-len must be >= 1 and --output-len >= 2")
    server = Server(args, max(streams))
    rows = []
    try:
        for n in streams:
            lc = LlamaBatched(args, n)
            prompts = prompts_for(n, args.input_len, args.output_len,
                                  lc.vocab, 1 << 20)
            kv, ll = [], []
            for _ in range(args.reps):
                kv.append(run_kvserve(args, server, n))
                ll.append(run_llamacpp(lc, prompts, args.output_len))
            lc.close()

            def med(rs, k):
                return statistics.median(r[k] for r in rs)

            row = {"streams": n,
                   "kvserve_tps": med(kv, "tps"),
                   "llamacpp_tps": med(ll, "tps"),
                   "kvserve_decode_tps": med(kv, "decode_tps"),
                   "llamacpp_decode_tps": med(ll, "decode_tps"),
                   "kvserve_runs_tps": [r["tps"] for r in kv],
                   "llamacpp_runs_tps": [r["tps"] for r in ll]}
            row["ratio"] = row["kvserve_tps"] / row["llamacpp_tps"]
            row["decode_ratio"] = (row["kvserve_decode_tps"] /
                                   row["llamacpp_decode_tps"])
            rows.append(row)
            if not args.json:
                print(f"N={n}: kvserve {row['kvserve_tps']:.1f} t/s, llama.cpp "
                      f"{row['llamacpp_tps']:.1f} t/s, ratio "
                      f"{row['ratio']:.2f}", file=sys.stderr)
    finally:
        server.stop()
    res = {"input_len": args.input_len, "output_len": args.output_len,
           "threads": args.threads, "reps": args.reps,
           "kv_unified": bool(args.kv_unified), "flash_attn": args.flash_attn,
           "rows": rows}
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"prompt {args.input_len} + output {args.output_len} tokens per "
          f"stream, {args.threads} threads, median of {args.reps}")
    print(f"{'streams':>8}{'kvserve t/s':>13}{'llama.cpp t/s':>15}{'ratio':>7}"
          f"{'kv dec t/s':>12}{'lc dec t/s':>12}{'dec ratio':>10}")
    for r in rows:
        print(f"{r['streams']:>8}{r['kvserve_tps']:>13.1f}"
              f"{r['llamacpp_tps']:>15.1f}{r['ratio']:>7.2f}"
              f"{r['kvserve_decode_tps']:>12.1f}"
              f"{r['llamacpp_decode_tps']:>12.1f}{r['decode_ratio']:>10.2f}")
    return 0
