#!/usr/bin/env python3
"""The simulated device against published throughput figures.

Replays the offline throughput benchmark of TensorRT-LLM's performance
overview (every request queued at once, fixed input/output lengths, the
figure being total output tokens/s) with `kvserve sim-replay` on the
simulated GPU at the roofline defaults, and prints the simulated and the
published figure and their difference per case.

Source of the published figures: NVIDIA TensorRT-LLM, docs/source/
performance/perf-overview.md ("Throughput Measurements", FP8 models
nvidia/Llama-3.3-70B-Instruct-FP8 and nvidia/Llama-3.1-8B-Instruct-FP8,
trtllm-bench throughput, PyTorch backend), as stored at commit
00f37686aa854010d68bcbd0f4ab000221541ca6 of github.com/NVIDIA/TensorRT-LLM.

Settings that follow that setup, stated, not fitted: fp8 weights
(--sim-weight-bytes 1), an fp8 KV cache (the ModelOpt FP8 checkpoints
quantize KV to FP8), 95% of GPU memory for weights and KV (the overview
raises kv_cache_free_gpu_mem_fraction to 0.95), 2048 sequences and 8192
batched tokens a step. kvserve's own scheduler decides the rest: paged
admission with preemption, where TensorRT-LLM's default scheduler
(GUARANTEED_NO_EVICT) reserves each request's whole output up front. The presets are Llama-3-70B and -8B: the architectures of 3.3 70B and
3.1 8B but an 8K context, so cases past 8K tokens are left out.

    tools/sim_fidelity.py --kvserve build/server/kvserve [--requests 1500]
        [--device sim:h100 ...] [--sim-arg=--sim-flops-efficiency --sim-arg=0.5]
"""
import argparse
import json
import subprocess
import sys

# (model, device, input, output, published output tokens/s)
CASES = [
    ("llama3-70b", "sim:h200", 128, 128, 3803),
    ("llama3-70b", "sim:h200", 128, 2048, 4336),
    ("llama3-70b", "sim:h200", 1000, 1000, 2909),
    ("llama3-70b", "sim:h200", 2048, 128, 442),
    ("llama3-70b", "sim:h200", 2048, 2048, 2003),
    ("llama3-70b", "sim:h200", 5000, 500, 566),
    ("llama3-70b", "sim:h100x2", 128, 128, 6378),
    ("llama3-70b", "sim:h100x2", 1000, 1000, 4205),
    ("llama3-70b", "sim:h100x2", 2048, 128, 762),
    ("llama3-70b", "sim:h100x2", 2048, 2048, 3082),
    ("llama3-8b", "sim:h200", 128, 128, 27911),
    ("llama3-8b", "sim:h200", 1000, 1000, 17744),
    ("llama3-8b", "sim:h200", 2048, 128, 3538),
    ("llama3-8b", "sim:h200", 2048, 2048, 12194),
    ("llama3-8b", "sim:h100", 128, 128, 28312),
    ("llama3-8b", "sim:h100", 1000, 1000, 15220),
    ("llama3-8b", "sim:h100", 2048, 128, 3450),
    ("llama3-8b", "sim:h100", 2048, 2048, 9305),
]


def replay(args, model, device, isl, osl):
    cmd = [args.kvserve, "sim-replay", "--model", model, "--device", device,
           "--sim-weight-bytes", "1", "--kv-cache-dtype", "fp8",
           "--gpu-memory-fraction", "0.95",
           "--max-num-seqs", "2048", "--max-num-batched-tokens", "8192",
           "--num-requests", str(args.requests), "--input-len", str(isl),
           "--output-len", str(osl), "--json", *args.sim_arg]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvserve", required=True)
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--sim-arg", action="append", default=[],
                   help="an extra sim-replay argument (repeatable), e.g. "
                   "--sim-arg=--sim-flops-efficiency --sim-arg=0.5")
    p.add_argument("--device", action="append", default=[],
                   help="only the cases on this device (repeatable), e.g. "
                   "sim:h100 sim:h100x2")
    args = p.parse_args()
    print(f"{'model':<11}{'device':<12}{'ISL/OSL':>10}{'sim tok/s':>11}"
          f"{'published':>11}{'error':>8}{'speed':>8}")
    errors = []
    for model, device, isl, osl, published in CASES:
        if args.device and device not in args.device:
            continue
        r = replay(args, model, device, isl, osl)
        err = r["output_throughput"] / published - 1
        errors.append(abs(err))
        print(f"{model:<11}{device:<12}{f'{isl}/{osl}':>10}"
              f"{r['output_throughput']:>11.0f}{published:>11}"
              f"{err:>+8.1%}{r['speedup']:>7.0f}x")
    within = sum(e <= 0.15 for e in errors)
    print(f"within 15%: {within} of {len(errors)}; mean |error| "
          f"{sum(errors) / len(errors):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
