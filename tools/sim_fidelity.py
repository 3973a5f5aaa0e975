#!/usr/bin/env python3
"""The simulated device against published throughput figures.

Replays the offline throughput benchmark of TensorRT-LLM's performance
overview (every request queued at once, fixed input/output lengths, the
figure being total output tokens/s) with `kvserve sim-replay` on the
simulated GPU at parameters frozen before the held-out cases were first
replayed, and prints the simulated and the published figure, their
difference per case, and the errors of each role (calibrated on, checked on
while calibrating, held out) apart.

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
(GUARANTEED_NO_EVICT) reserves each request's whole output up front. 1,500 requests per case
(the overview uses 1,000-30,000). The presets are Llama-3-70B and -8B: the
architectures of 3.3 70B and 3.1 8B but an 8K context; what is left out and
why, the tool prints (LEFT_OUT).

    tools/sim_fidelity.py --kvserve build/server/kvserve [--requests 1500]
        [--device sim:h100 ...] [--role new ...]
        [--refit-arg=--sim-flops-efficiency --refit-arg=0.5 ...]
"""
import argparse
import json
import subprocess
import sys

# The published figures, every dense Llama case of the overview that the
# presets and GPU specs cover, and the role each plays:
#   fit   the eight H100 cases the defaults were chosen on (in-sample)
#   seen  the ten H200 cases checked against while the defaults were chosen;
#         the host-time term was added after a miss among them (8B 128/128),
#         so they are not blind
#   new   never replayed before the parameters below were frozen (held out)
# (model, device, input, output, published output tokens/s, role)
CASES = [
    ("llama3-70b", "sim:h200", 128, 128, 3803, "seen"),
    ("llama3-70b", "sim:h200", 128, 2048, 4336, "seen"),
    ("llama3-70b", "sim:h200", 128, 4096, 2872, "new"),
    ("llama3-70b", "sim:h200", 500, 2000, 3666, "new"),
    ("llama3-70b", "sim:h200", 1000, 1000, 2909, "seen"),
    ("llama3-70b", "sim:h200", 1000, 2000, 2994, "new"),
    ("llama3-70b", "sim:h200", 2048, 128, 442, "seen"),
    ("llama3-70b", "sim:h200", 2048, 2048, 2003, "seen"),
    ("llama3-70b", "sim:h200", 5000, 500, 566, "seen"),
    ("llama3-70b", "sim:h100x2", 128, 128, 6378, "fit"),
    ("llama3-70b", "sim:h100x2", 128, 2048, 6651, "new"),
    ("llama3-70b", "sim:h100x2", 128, 4096, 4199, "new"),
    ("llama3-70b", "sim:h100x2", 500, 2000, 5222, "new"),
    ("llama3-70b", "sim:h100x2", 1000, 1000, 4205, "fit"),
    ("llama3-70b", "sim:h100x2", 1000, 2000, 4146, "new"),
    ("llama3-70b", "sim:h100x2", 2048, 128, 762, "fit"),
    ("llama3-70b", "sim:h100x2", 2048, 2048, 3082, "fit"),
    ("llama3-70b", "sim:h100x2", 5000, 500, 898, "new"),
    ("llama3-8b", "sim:h200", 128, 128, 27911, "seen"),
    ("llama3-8b", "sim:h200", 128, 2048, 26221, "new"),
    ("llama3-8b", "sim:h200", 128, 4096, 18027, "new"),
    ("llama3-8b", "sim:h200", 500, 2000, 20770, "new"),
    ("llama3-8b", "sim:h200", 1000, 1000, 17744, "seen"),
    ("llama3-8b", "sim:h200", 1000, 2000, 16828, "new"),
    ("llama3-8b", "sim:h200", 2048, 128, 3538, "seen"),
    ("llama3-8b", "sim:h200", 2048, 2048, 12194, "seen"),
    ("llama3-8b", "sim:h200", 5000, 500, 3902, "new"),
    ("llama3-8b", "sim:h100", 128, 128, 28312, "fit"),
    ("llama3-8b", "sim:h100", 128, 2048, 22714, "new"),
    ("llama3-8b", "sim:h100", 128, 4096, 14325, "new"),
    ("llama3-8b", "sim:h100", 500, 2000, 17660, "new"),
    ("llama3-8b", "sim:h100", 1000, 1000, 15220, "fit"),
    ("llama3-8b", "sim:h100", 1000, 2000, 13899, "new"),
    ("llama3-8b", "sim:h100", 2048, 128, 3450, "fit"),
    ("llama3-8b", "sim:h100", 2048, 2048, 9305, "fit"),
    ("llama3-8b", "sim:h100", 5000, 500, 3459, "new"),
]

# The parameters every case is replayed with, frozen on 2026-12-05 (the
# roofline defaults of models/sim/roofline.h at that date) before any "new"
# case was first replayed; passed explicitly, so a later change of the
# defaults cannot move the held-out figures. --refit-arg replaces them for an
# experiment; its output is then not a held-out figure.
FROZEN = ["--sim-memory-efficiency", "0.75", "--sim-flops-efficiency", "0.5",
          "--sim-host-us-per-seq", "4"]

# Published dense-Llama figures of the overview outside the simulator's
# range, each with the reason.
LEFT_OUT = [
    ("Llama 3.3 70B and 3.1 8B, 20000/2000 (4 cases)",
     "a 22K-token context; the presets are Llama-3 with an 8K context"),
    ("Llama 3.1 405B, H200/H100 TP8 FP8 (20 cases)", "no 405B preset"),
    ("B200, GB200, RTX 6000 Pro columns", "FP4 weights; no spec for those GPUs"),
    ("Llama 4, Qwen3 tables", "mixture-of-experts models; not modelled"),
]


def replay(args, model, device, isl, osl):
    params = args.refit_arg if args.refit_arg else FROZEN
    cmd = [args.kvserve, "sim-replay", "--model", model, "--device", device,
           "--sim-weight-bytes", "1", "--kv-cache-dtype", "fp8",
           "--gpu-memory-fraction", "0.95",
           "--max-num-seqs", "2048", "--max-num-batched-tokens", "8192",
           "--num-requests", str(args.requests), "--input-len", str(isl),
           "--output-len", str(osl), "--json", *params]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def summary(errors):
    """'k of n within 15%, mean |error| m, worst w' over signed errors."""
    if not errors:
        return "none"
    worst = max(errors, key=abs)
    within = sum(abs(e) <= 0.15 for e in errors)
    mean = sum(abs(e) for e in errors) / len(errors)
    return (f"{within} of {len(errors)} within 15%, mean |error| {mean:.1%}, "
            f"worst {worst:+.1%}")


ROLE_TITLES = {
    "fit": "calibrated on (in-sample, 8 H100 cases)",
    "seen": "checked on while calibrating (10 H200 cases, not blind)",
    "new": "held out (first replayed with the parameters frozen)",
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvserve", required=True)
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--refit-arg", action="append", default=[],
                   help="replace the frozen parameters (repeatable), e.g. "
                   "--refit-arg=--sim-flops-efficiency --refit-arg=0.5; "
                   "the figures are then an experiment, not a check")
    p.add_argument("--device", action="append", default=[],
                   help="only the cases on this device (repeatable), e.g. "
                   "sim:h100 sim:h100x2")
    p.add_argument("--role", action="append", default=[],
                   choices=sorted(ROLE_TITLES),
                   help="only the cases of this role (repeatable)")
    args = p.parse_args()
    print("parameters: " + " ".join(args.refit_arg or FROZEN) +
          (" (an experiment, not the frozen set)" if args.refit_arg
           else " (frozen 2026-12-05)"))
    print(f"{'model':<11}{'device':<12}{'ISL/OSL':>10}{'sim tok/s':>11}"
          f"{'published':>11}{'error':>8}{'speed':>8}  role")
    by_role = {role: [] for role in ROLE_TITLES}
    for model, device, isl, osl, published, role in CASES:
        if args.device and device not in args.device:
            continue
        if args.role and role not in args.role:
            continue
        r = replay(args, model, device, isl, osl)
        err = r["output_throughput"] / published - 1
        by_role[role].append(err)
        print(f"{model:<11}{device:<12}{f'{isl}/{osl}':>10}"
              f"{r['output_throughput']:>11.0f}{published:>11}"
              f"{err:>+8.1%}{r['speedup']:>7.0f}x  {role}")
    for role, title in ROLE_TITLES.items():
        if by_role[role]:
            print(f"{title}: {summary(by_role[role])}")
    print("left out of the overview's tables:")
    for what, why in LEFT_OUT:
        print(f"  {what}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
