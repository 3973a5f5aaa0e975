#!/usr/bin/env python3
"""Writes a Llama GGUF of a chosen shape with random F16 weights.

The default model's rows are 576 wide, not a multiple of 256, so
llama-quantize stores almost none of its tensors in K-quants; the files people
download (Llama-3-8B Q4_K_M and the like) are nearly all Q4_K and Q6_K. This
file has the default model's tokenizer and chat template and a shape whose
rows are multiples of 256, so that llama-quantize turns it into a realistic
K-quant mix for speed, memory and agreement measurements against llama.cpp.
The weights are random (seeded): its text is noise, but kvserve and llama.cpp
compute the same noise. A tiny shape of it is a draft model that accepts
nothing (tests/server/speculative_e2e_test.py).

    tools/make_synthetic_gguf.py --out build-llama/synth-f16.gguf \\
        [--hidden 2048 --ffn 5632 --layers 8 --heads 32 --kv-heads 4]

Then, for example:
    build-llama/bin/llama-quantize build-llama/synth-f16.gguf \\
        build-llama/synth-Q4_K_M.gguf Q4_K_M
"""

import argparse
import os
import sys

import gguf
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")

# Keys the new shape replaces; everything else (tokenizer, template, RoPE
# base, norm epsilon) is copied from the source.
SHAPE_KEYS = {
    "llama.embedding_length", "llama.feed_forward_length", "llama.block_count",
    "llama.attention.head_count", "llama.attention.head_count_kv",
    "llama.rope.dimension_count", "general.file_type", "general.name",
}


def copy_metadata(reader, writer, swap_tokens=None):
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name in SHAPE_KEYS:
            continue
        if name == "general.architecture":
            continue  # the writer writes it
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if name == "tokenizer.ggml.tokens" and swap_tokens:
            i, j = swap_tokens
            value[i], value[j] = value[j], value[i]
        writer.add_key_value(name, value, vtype, sub_type=sub)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=SOURCE)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--swap-tokens", metavar="I,J",
                    help="exchange the texts of tokens I and J (a tokenizer "
                    "that differs from the source's, for tests)")
    args = ap.parse_args()
    if args.hidden % args.heads or args.heads % args.kv_heads:
        sys.exit("--hidden must divide by --heads, --heads by --kv-heads")
    head_dim = args.hidden // args.heads

    reader = gguf.GGUFReader(args.source)
    vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(args.out, "llama")
    writer.add_name(f"synthetic-llama-{args.hidden}x{args.layers}")
    swap = ([int(t) for t in args.swap_tokens.split(",")]
            if args.swap_tokens else None)
    copy_metadata(reader, writer, swap)
    writer.add_embedding_length(args.hidden)
    writer.add_feed_forward_length(args.ffn)
    writer.add_block_count(args.layers)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    rng = np.random.default_rng(args.seed)

    def weight(rows, cols):
        # GGUF shapes are {cols, rows}; numpy arrays are [rows][cols].
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        return (w / np.sqrt(cols)).astype(np.float16)

    ones = np.ones(args.hidden, dtype=np.float32)
    kv = args.kv_heads * head_dim
    writer.add_tensor("token_embd.weight", weight(vocab, args.hidden))
    for i in range(args.layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", ones)
        writer.add_tensor(p + "attn_q.weight", weight(args.hidden, args.hidden))
        writer.add_tensor(p + "attn_k.weight", weight(kv, args.hidden))
        writer.add_tensor(p + "attn_v.weight", weight(kv, args.hidden))
        writer.add_tensor(p + "attn_output.weight",
                          weight(args.hidden, args.hidden))
        writer.add_tensor(p + "ffn_norm.weight", ones)
        writer.add_tensor(p + "ffn_gate.weight", weight(args.ffn, args.hidden))
        writer.add_tensor(p + "ffn_up.weight", weight(args.ffn, args.hidden))
        writer.add_tensor(p + "ffn_down.weight", weight(args.hidden, args.ffn))
    writer.add_tensor("output_norm.weight", ones)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.out}: {os.path.getsize(args.out) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
