#!/usr/bin/env python3
"""Regenerates tests/data/parity/: llama.cpp reference outputs for the
default model (SmolLM2-135M-Instruct Q4_1), used by tests/models/parity_test.

For each fixed prompt: llama.cpp's prompt token ids, its greedy 32-token
continuation (argmax of llama.cpp's own logits, one token at a time), and the
logits at the last prompt position (float32, raw little-endian, one row of
n_vocab per prompt, in parity_logits.f32).

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
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
