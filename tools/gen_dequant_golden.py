#!/usr/bin/env python3
"""Writes tests/data/dequant_golden.json: reference dequantized values of a
few tensors of the default model, computed with the `gguf` Python package
(the llama.cpp project's reader), for tests/models/dequant_test.cc.

Usage: tools/gen_dequant_golden.py [model.gguf] [out.json]
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "data", "dequant_golden.json")

# (tensor name, row or None for the whole tensor)
CASES = [
    ("blk.0.attn_q.weight", None),     # Q4_1
    ("token_embd.weight", 1000),       # Q8_0
    ("blk.0.attn_norm.weight", None),  # F32
    ("blk.29.ffn_down.weight", 5),     # Q4_1, last layer
]


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else MODEL
    out = sys.argv[2] if len(sys.argv) > 2 else OUT
    reader = GGUFReader(model)
    tensors = {t.name: t for t in reader.tensors}
    cases = []
    for name, row in CASES:
        t = tensors[name]
        data = t.data if row is None else t.data[row:row + 1]
        values = dequantize(data, t.tensor_type).astype(np.float32).ravel()
        v64 = values.astype(np.float64)
        cases.append({
            "tensor": name,
            "type": t.tensor_type.name,
            "row": -1 if row is None else row,
            "count": int(values.size),
            "first": [float(x) for x in values[:64]],
            "sum": float(v64.sum()),
            "sum_sq": float((v64 * v64).sum()),
        })
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"model": os.path.basename(model), "cases": cases}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
