#!/usr/bin/env python3
"""Writes a GGUF of random blocks of every quantized weight type kvserve
reads, each beside its dequantization by the `gguf` package's numpy
reference (gguf.quants), for tests/models/quant_types_test.cc.

    gen_quant_blocks.py OUT.gguf [--rows 37] [--cols 512] [--seed 1]

For each type T: tensor "T.q" holds rows x cols elements of random T blocks
(every bit random except the fp16 scale fields, which are drawn from a
normal distribution so that no block is inf or NaN), and "T.ref" is F32,
gguf.quants.dequantize of the same bytes.
"""

import argparse
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as Q

# Byte offsets of the fp16 fields (scales, mins) inside one block.
FP16_FIELDS = {
    Q.Q4_0: [0],
    Q.Q4_1: [0, 2],
    Q.Q5_0: [0],
    Q.Q5_1: [0, 2],
    Q.Q8_0: [0],
    Q.Q2_K: [80, 82],
    Q.Q3_K: [108],
    Q.Q4_K: [0, 2],
    Q.Q5_K: [0, 2],
    Q.Q6_K: [208],
    Q.IQ4_NL: [0],
    Q.IQ4_XS: [0],
}


def random_blocks(qtype, rows, cols, rng):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert cols % block == 0, (qtype.name, cols)
    n = rows * cols // block
    data = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in FP16_FIELDS[qtype]:
        scale = (rng.standard_normal(n) * 0.02).astype(np.float16)
        data[:, off:off + 2] = scale.view(np.uint8).reshape(n, 2)
    return data.reshape(rows, cols // block * size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=37)
    ap.add_argument("--cols", type=int, default=512)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    w = gguf.GGUFWriter(args.out, "quant-blocks")
    for qtype in FP16_FIELDS:
        data = random_blocks(qtype, args.rows, args.cols, rng)
        ref = gguf.quants.dequantize(data, qtype).astype(np.float32)
        assert ref.shape == (args.rows, args.cols), ref.shape
        assert np.isfinite(ref).all(), qtype.name
        w.add_tensor(f"{qtype.name}.q", data, raw_dtype=qtype)
        w.add_tensor(f"{qtype.name}.ref", ref)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
