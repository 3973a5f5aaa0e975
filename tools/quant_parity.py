#!/usr/bin/env python3
"""kvserve against llama.cpp on the GGUF quantization mixes people download.

For each --types mix, llama.cpp's llama-quantize requantizes --source (default:
the default model, SmolLM2-135M-Instruct Q4_1; tools/make_synthetic_gguf.py
writes one whose rows take K-quants) into that mix; then on the same file:
  1. llama-server greedily continues a fixed prompt for --steps tokens (the
     reference sequence, with its top log-probabilities);
  2. kvserve's daemon, teacher-forced on that sequence, predicts each next
     token (step i sends the prompt plus the first i reference tokens, one
     greedy token out, over gRPC with token ids, prefix caching on).
It prints, per mix: the tensor types in the file, the share of steps where
kvserve's greedy token equals llama.cpp's, and the mean and largest
|log-probability difference| of the reference token where both report it.
The source file is the first row, as the baseline of the same method.

    tools/quant_parity.py [--types Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,Q2_K,IQ4_XS]
                          [--steps 256] [--threads 2] [--source GGUF] [--json]

Needs deploy/setup.sh --bench (build-llama/bin/llama-quantize and
llama-server) and a built kvserve (build/server/kvserve).
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from bench_vs_llama_server import (BenchError, LlamaServerProcess,  # noqa: E402
                                   post_json)
from kvserve_process import KvserveProcess, compile_proto  # noqa: E402

SOURCE = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
CORPUS = os.path.join(ROOT, "tests", "data", "eval", "gpl-3.0.txt")
PROMPT_CHARS = 600


def quantize(args, qtype):
    """--source requantized to `qtype` (cached in --workdir); None: itself."""
    if qtype is None:
        return args.source
    stem = os.path.basename(args.source).split(".")[0]
    out = os.path.join(args.workdir, f"{stem}.{qtype}.requant.gguf")
    if not os.path.exists(out):
        tmp = out + ".tmp"
        run = subprocess.run(
            [os.path.join(args.llama_bin, "llama-quantize"),
             "--allow-requantize", args.source, tmp, qtype,
             str(args.threads)], capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise BenchError(f"llama-quantize {qtype} failed:\n"
                             f"{run.stdout[-2000:]}{run.stderr[-2000:]}")
        os.replace(tmp, out)
    return out


def tensor_types(path):
    """{'Q4_K': n, ...} over the file's tensors."""
    import gguf
    reader = gguf.GGUFReader(path)
    return dict(collections.Counter(t.tensor_type.name
                                    for t in reader.tensors))


def llama_reference(args, path, prompt_text):
    """(prompt ids, greedy continuation ids, per-step {token: logprob})."""
    llama = LlamaServerProcess([
        os.path.join(args.llama_bin, "llama-server"), "-m", path, "-t",
        str(args.threads), "-tb", str(args.threads), "-c", "2048", "-np",
        "1", "--no-webui"])
    try:
        prompt = post_json(llama.http_port, "/tokenize",
                           {"content": prompt_text,
                            "add_special": False})["tokens"]
        out = post_json(llama.http_port, "/completion", {
            "prompt": prompt, "n_predict": args.steps, "temperature": 0,
            "ignore_eos": True, "cache_prompt": False, "return_tokens": True,
            "n_probs": args.top, "post_sampling_probs": False}, timeout=600)
    finally:
        llama.kill()
    tokens = out["tokens"]
    probs = [{p["id"]: p["logprob"] for p in step.get("top_logprobs", [])}
             for step in out.get("completion_probabilities", [])]
    if len(tokens) != args.steps:
        raise BenchError(f"llama-server returned {len(tokens)} tokens, "
                         f"asked {args.steps}")
    return prompt, tokens, probs


def kvserve_forced(args, path, prompt, ref, pb, pb_grpc):
    """kvserve's greedy token and {token: logprob} at each forced step."""
    import grpc
    # fp16 KV as llama.cpp's default f16: only the weights' kernels differ.
    server = KvserveProcess(args.kvserve, ROOT, "--model", path, "--threads",
                            str(args.threads), "--max-model-len", "2048",
                            "--kv-cache-dtype", "fp16")
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        stub = pb_grpc.KvServeStub(channel)
        preds, probs = [], []
        for i in range(len(ref)):
            req = pb.GenerateRequest(
                prompt_token_ids=pb.TokenIds(ids=prompt + ref[:i]),
                sampling=pb.SamplingParams(temperature=0, max_tokens=1,
                                           ignore_eos=True,
                                           logprobs=args.top))
            msgs = list(stub.Generate(req, timeout=120))
            ids = [t for m in msgs for t in m.token_ids]
            lps = [lp for m in msgs for lp in m.logprobs]
            preds.append(ids[0])
            probs.append({t.token: t.logprob for t in lps[0].top})
        channel.close()
    finally:
        server.kill()
    return preds, probs


def compare(ref, ref_probs, preds, probs):
    agree = sum(p == r for p, r in zip(preds, ref)) / len(ref)
    diffs = [abs(lp[r] - mine[r])
             for r, lp, mine in zip(ref, ref_probs, probs)
             if r in lp and r in mine]
    return {
        "agreement": agree,
        "logprob_diff_mean": sum(diffs) / len(diffs) if diffs else None,
        "logprob_diff_max": max(diffs) if diffs else None,
        "logprob_compared": len(diffs),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default="Q4_K_M,Q5_K_M,Q6_K,Q3_K_M,Q2_K,IQ4_XS")
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--source", default=SOURCE)
    ap.add_argument("--kvserve",
                    default=os.path.join(ROOT, "build", "server", "kvserve"))
    ap.add_argument("--llama-bin",
                    default=os.path.join(ROOT, "build-llama", "bin"))
    ap.add_argument("--workdir",
                    default=os.path.join(ROOT, "build-llama", "quants"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    with open(CORPUS, encoding="utf-8") as f:
        prompt_text = f.read()[:PROMPT_CHARS]
    pb, pb_grpc = compile_proto(os.path.join(ROOT, "proto"),
                                tempfile.mkdtemp(prefix="kvserve_proto_"))
    rows = []
    try:
        for qtype in [None] + [t for t in args.types.split(",") if t]:
            path = quantize(args, qtype)
            qtype = qtype or "source"
            prompt, ref, ref_probs = llama_reference(args, path, prompt_text)
            preds, probs = kvserve_forced(args, path, prompt, ref, pb,
                                          pb_grpc)
            row = {"type": qtype, "bytes": os.path.getsize(path),
                   "tensors": tensor_types(path),
                   **compare(ref, ref_probs, preds, probs)}
            rows.append(row)
            if not args.json:
                print(f"{qtype:8s} agreement {row['agreement']:.3f}  "
                      f"|dlogprob| mean {row['logprob_diff_mean']:.4f} "
                      f"max {row['logprob_diff_max']:.4f} "
                      f"({row['logprob_compared']} steps)  "
                      f"{row['bytes'] / 2**20:.1f} MiB  {row['tensors']}",
                      flush=True)
    except BenchError as e:
        print(f"quant_parity: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"steps": args.steps, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
