#!/usr/bin/env python3
"""Regenerates tests/data/parity/: llama.cpp reference outputs for the
default model (SmolLM2-135M-Instruct Q4_1), used by tests/engine/parity_test.

For each fixed prompt: llama.cpp's prompt token ids, its greedy 32-token
continuation (argmax of llama.cpp's own logits, one token at a time), and the
logits at the last prompt position (float32, raw little-endian, one row of
n_vocab per prompt, in parity_logits.f32).

Also writes parity_fp64_logits.f32: the same last-position logits from an
independent float64 numpy forward over the dequantized GGUF weights (exact
math, no activation quantization), and prints how far llama.cpp is from it.

Needs llama-cpp-python (deploy/setup.sh --bench installs the pinned version).
Usage: tools/gen_parity_golden.py [path/to/model.gguf]
"""
import json
import os
import sys

import numpy as np
import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "data", "parity")
NEW_TOKENS = 32

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about autumn leaves.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4, 5, 6,",
    "Photosynthesis is the process by which plants",
    "Q: What is 12 times 12?\nA:",
]


def fp64_logits(model_path, prompts_ids):
    """Exact (float64) Llama forward of the GGUF's dequantized weights."""
    from gguf import GGUFReader
    from gguf.quants import dequantize
    r = GGUFReader(model_path)
    tensors = {t.name: t for t in r.tensors}
    field = lambda k: r.fields[k].contents()
    L = field("llama.block_count"); H = field("llama.attention.head_count")
    Hkv = field("llama.attention.head_count_kv")
    D = field("llama.embedding_length") // H
    eps = field("llama.attention.layer_norm_rms_epsilon")
    theta = field("llama.rope.freq_base")
    cache = {}

    def w(name):
        if name not in cache:
            t = tensors[name]
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            cache[name] = a.reshape([int(x) for x in reversed(t.shape)])
        return cache[name]

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def rope(x, n):  # ggml NORM rope: adjacent pairs rotate together
        t = x.shape[0]
        x = x.reshape(t, n, D // 2, 2)
        ang = np.arange(t)[:, None] * theta ** (-np.arange(0, D, 2) / D)
        c, s_ = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a, b = x[..., 0], x[..., 1]
        return np.stack([a * c - b * s_, a * s_ + b * c], -1).reshape(t, n * D)

    emb = w("token_embd.weight")
    out_rows = []
    for ids in prompts_ids:
        x, n = emb[ids], len(ids)
        for l in range(L):
            p = f"blk.{l}."
            h = norm(x, w(p + "attn_norm.weight").reshape(-1))
            q = rope(h @ w(p + "attn_q.weight").T, H)
            k = rope(h @ w(p + "attn_k.weight").T, Hkv)
            v = h @ w(p + "attn_v.weight").T
            att = np.zeros((n, H * D))
            for hh in range(H):
                g = hh // (H // Hkv)
                sc = q[:, hh*D:(hh+1)*D] @ k[:, g*D:(g+1)*D].T / np.sqrt(D)
                sc += np.triu(np.full((n, n), -np.inf), 1)
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                sc /= sc.sum(-1, keepdims=True)
                att[:, hh*D:(hh+1)*D] = sc @ v[:, g*D:(g+1)*D]
            x = x + att @ w(p + "attn_output.weight").T
            h = norm(x, w(p + "ffn_norm.weight").reshape(-1))
            gt = h @ w(p + "ffn_gate.weight").T
            up = h @ w(p + "ffn_up.weight").T
            x = x + (gt / (1 + np.exp(-gt)) * up) @ w(p + "ffn_down.weight").T
        out_rows.append(norm(x[-1], w("output_norm.weight").reshape(-1)) @ emb.T)
    return np.stack(out_rows)


def main():
    llm = llama_cpp.Llama(model_path=MODEL, n_ctx=512, n_batch=512,
                          n_threads=2, logits_all=True, verbose=False,
                          type_k=0, type_v=0)  # f32 KV cache, as kvserve CPU
    n_vocab = llm.n_vocab()
    cases, logit_rows = [], []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        logit_rows.append(last)
        out = []
        logits = last
        for _ in range(NEW_TOKENS):
            tok = int(np.argmax(logits))
            out.append(tok)
            llm.eval([tok])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        cases.append({"prompt": prompt, "prompt_ids": ids,
                      "greedy_ids": out,
                      "greedy_text": llm.detokenize(out).decode(
                          "utf-8", errors="replace")})
    os.makedirs(OUT, exist_ok=True)
    meta = {"model": os.path.basename(MODEL),
            "reference": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}",
            "n_vocab": n_vocab, "new_tokens": NEW_TOKENS, "kv_type": "f32",
            "cases": cases}
    with open(os.path.join(OUT, "parity.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    np.stack(logit_rows).astype("<f4").tofile(
        os.path.join(OUT, "parity_logits.f32"))
    exact = fp64_logits(MODEL, [c["prompt_ids"] for c in cases])
    exact.astype("<f4").tofile(os.path.join(OUT, "parity_fp64_logits.f32"))
    for i, row in enumerate(logit_rows):
        rel = np.linalg.norm(row - exact[i]) / np.linalg.norm(exact[i])
        print(f"case {i}: llama.cpp vs fp64 relative L2 {rel:.4f}")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
