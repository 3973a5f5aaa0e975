#!/usr/bin/env python3
"""`kvserve eval` end to end: the real binary on the default model.

One run of two 128-token windows of the default text (tests/data/eval/
gpl-3.0.txt) with --json, for every CPU KV dtype: the f32 row is the
reference itself (delta PPL and mean KLD exactly 0, top-1 agreement 100%);
every other dtype has KLD > 0 and int4 more than int8; fp16 and bf16 stay
well below int4; int4 and int8 are below what they cost unrotated; perplexities are finite and > 1; bytes per token are
SmolLM2-135M's (2 x 30 layers x 3 KV heads x one 64-element row) and
blocks per GiB follow from them at block size 16. The text table prints the
same rows. Bad flags are refused with a non-zero exit naming the flag.
The int8 KV gate: over two 512-token windows, int8's mean KLD is at most
1.3x fp16's.

    eval_e2e_test.py --binary build/server/kvserve --source-dir .
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ARGS = None
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
BYTES_PER_TOKEN = {"f32": 46080, "fp16": 23040, "bf16": 23040,
                   "int8": 12240, "int4": 6480}


def run_eval(*flags, timeout=120):
    return subprocess.run(
        [ARGS.binary, "eval", "--model",
         os.path.join(ARGS.source_dir, "weights", MODEL), *flags],
        capture_output=True, text=True, timeout=timeout)


class Eval(unittest.TestCase):
    result = None

    @classmethod
    def setUpClass(cls):
        out = run_eval("--context", "128", "--max-windows", "2", "--json")
        assert out.returncode == 0, out.stderr
        cls.result = json.loads(out.stdout)
        cls.rows = {r["kv_dtype"]: r for r in cls.result["results"]}

    def test_default_dtypes_in_order(self):
        self.assertEqual([r["kv_dtype"] for r in self.result["results"]],
                         ["f32", "fp16", "bf16", "int8", "int4"])
        self.assertEqual(self.result["windows"], 2)
        self.assertGreater(self.result["windows_available"], 2)
        self.assertTrue(self.result["text"].endswith(
            "tests/data/eval/gpl-3.0.txt"))

    def test_f32_is_the_reference(self):
        f32 = self.rows["f32"]
        self.assertEqual(f32["delta_ppl_pct"], 0.0)
        self.assertEqual(f32["mean_kld"], 0.0)
        self.assertEqual(f32["top1_agreement_pct"], 100.0)

    def test_quantized_kv_diverges_in_order(self):
        for dtype in ("fp16", "bf16", "int8", "int4"):
            self.assertGreater(self.rows[dtype]["mean_kld"], 0.0, dtype)
        # 16-bit KV stays far below int4 (the int8 activations of the
        # Q4_1 matmuls amplify any KV rounding; see docs/PERFORMANCE.md).
        for dtype in ("fp16", "bf16"):
            self.assertLess(self.rows[dtype]["mean_kld"], 0.05, dtype)
        self.assertGreater(self.rows["int4"]["mean_kld"],
                           self.rows["int8"]["mean_kld"])
        self.assertGreater(self.rows["int4"]["mean_kld"],
                           4 * self.rows["fp16"]["mean_kld"])

    def test_integer_kv_is_stored_rotated(self):
        # The Hadamard rotation of Q, K and V before int4/int8 storage
        # (kvcache::KvRotationFor): on these windows int4's KLD is 0.17 with
        # it and 0.52 without (int8's 0.0093 and 0.0114 are too close to
        # hold on every kernel path).
        self.assertLess(self.rows["int4"]["mean_kld"], 0.3)

    def test_f32_perplexity_is_the_measured_one(self):
        # 29.157 on the x86-64 AVX-512 machine this was written on; other
        # kernels round differently, hence 3%. Scoring the wrong half of the
        # windows, or the wrong targets, lands far outside.
        self.assertAlmostEqual(self.rows["f32"]["ppl"], 29.157,
                               delta=0.03 * 29.157)

    def test_perplexity_and_sizes(self):
        # Windows of 128 score positions 64..126: 63 per window.
        for dtype, row in self.rows.items():
            self.assertTrue(math.isfinite(row["ppl"]), dtype)
            self.assertGreater(row["ppl"], 1.0, dtype)
            self.assertGreater(row["ppl_stderr"], 0.0, dtype)
            self.assertEqual(row["tokens_scored"], 2 * 63, dtype)
            self.assertEqual(row["bytes_per_token"], BYTES_PER_TOKEN[dtype])
            self.assertEqual(row["blocks_per_gib"],
                             (1 << 30) // (16 * BYTES_PER_TOKEN[dtype]))
            self.assertLessEqual(row["top1_agreement_pct"], 100.0)

    def test_table_matches_json(self):
        out = run_eval("--context", "128", "--max-windows", "1",
                       "--kv-cache-dtype", "f32,int8", "--chunk", "32")
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = [ln.split() for ln in out.stdout.splitlines()]
        table = {ln[0]: ln for ln in lines if ln and ln[0] in ("f32", "int8")}
        self.assertEqual(set(table), {"f32", "int8"})
        self.assertEqual(table["f32"][4:6], ["+0.000%", "0.000000"])
        self.assertEqual(table["int8"][-2:], ["12240", "5482"])
        # Without f32 in the list there is no delta to print.
        out = run_eval("--context", "128", "--max-windows", "1",
                       "--kv-cache-dtype", "int8", "--chunk", "32")
        self.assertEqual(out.returncode, 0, out.stderr)
        row = [ln.split() for ln in out.stdout.splitlines()
               if ln.startswith("int8 ")]
        self.assertEqual(row[0][4], "n/a")

    def test_bad_flags_are_refused(self):
        short = os.path.join(self.tmp, "short.txt")
        with open(short, "w", encoding="utf-8") as f:
            f.write("Only a few words here.\n")
        cases = [
            (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype fp8"),
            (["--kv-cache-dtype", "f32,int5"], "--kv-cache-dtype"),
            (["--context", "127", "--chunk", "32"], "--context 127"),
            (["--context", "96"], "--context 96"),  # < 2 x chunk 64
            (["--text", short], "fewer than one window of --context"),
            (["--text", os.path.join(self.tmp, "absent.txt")], "--text"),
            (["--chunk", "0"], "--chunk"),
            # A chunk spanning key groups would read them in full precision.
            (["--kv-cache-dtype", "int3", "--chunk", "64"],
             "--chunk 64: the int3 lane needs a chunk dividing 32"),
        ]
        for flags, needle in cases:
            with self.subTest(flags=flags):
                out = run_eval(*flags, timeout=60)
                self.assertNotEqual(out.returncode, 0, out.stdout)
                self.assertIn(needle, out.stderr)
        out = run_eval("--text", short, timeout=60)
        self.assertRegex(out.stderr, r": \d+ tokens, fewer")



class Int8KvGate(unittest.TestCase):
    """The quality gate of int8 KV, the CPU default: over two 512-token
    windows (scored on their second halves) its mean KLD against f32 KV is
    at most 1.3x fp16's (measured 2026-12-05: 0.0043 vs 0.0037, 1.15x; at
    4K tokens in docs/PERFORMANCE.md). About 8 s."""

    def test_int8_kld_within_1_3x_of_fp16(self):
        out = run_eval("--context", "512", "--max-windows", "2",
                       "--kv-cache-dtype", "f32,fp16,int8", "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = {r["kv_dtype"]: r for r in json.loads(out.stdout)["results"]}
        self.assertEqual(json.loads(out.stdout)["windows"], 2)
        fp16, int8 = rows["fp16"]["mean_kld"], rows["int8"]["mean_kld"]
        self.assertGreater(fp16, 0.0)
        self.assertLessEqual(int8, 1.3 * fp16,
                             f"int8 KV mean KLD {int8:.5f} vs fp16 "
                             f"{fp16:.5f}")


class LowBitKvGate(unittest.TestCase):
    """int3 and int2 (KIVI) against llama.cpp's q4_0 layout (int4, with the
    same rotation) over two 512-token windows in chunks of 8, so every key
    group (32 tokens) is requantized as it fills and each token reads its
    own group in full precision, as a decode step does (KIVI's residual):
    int3 diverges half as much as int4 in 11% fewer bytes; int2 takes a
    third fewer bytes and diverges more (measured 2026-12-07: KLD int3
    0.038, int4 0.082, int2 0.261; with the newest group read from its
    codes 0.086 and 0.633; 4K and 8K in docs/PERFORMANCE.md). About 7 s."""

    def test_a_low_bit_lane_defaults_to_one_key_group_per_chunk(self):
        out = run_eval("--kv-cache-dtype", "int2", "--max-windows", "1",
                       "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(json.loads(out.stdout)["chunk"], 32)

    def test_int3_beats_q4_0_in_fewer_bytes(self):
        out = run_eval("--context", "512", "--chunk", "8", "--max-windows",
                       "2", "--kv-cache-dtype", "f32,int4,int3,int2",
                       "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = {r["kv_dtype"]: r for r in json.loads(out.stdout)["results"]}
        kld = {d: rows[d]["mean_kld"] for d in ("int4", "int3", "int2")}
        self.assertLess(kld["int3"], 0.6 * kld["int4"], kld)
        self.assertLess(kld["int4"], kld["int2"], kld)
        self.assertLess(kld["int2"], 0.4, kld)
        size = {d: rows[d]["bytes_per_token"] for d in kld}
        self.assertEqual(size, {"int4": 6480, "int3": 5760, "int2": 4320})
        # 4x and 5.3x fewer bytes than fp16 (23,040 per token).
        self.assertLessEqual(size["int3"] * 4, 23040)
        self.assertLessEqual(size["int2"] * 16, 23040 * 3)


class KvPolicyGate(unittest.TestCase):
    """--kv-policy (kv_policy streaming, f32 KV) against the full cache over
    two 512-token windows, chunks of 16: a window covering the context
    changes nothing; a 128-token window with a sink block diverges, and far
    less than the same window without sinks (StreamingLLM's finding;
    measured 2026-12-06: KLD 0.090 vs 0.855, top-1 85.5% vs 56.3%). Its
    peak KV is the sinks' block + window + one chunk. About 7 s."""

    def test_sinks_keep_a_small_window_close_to_the_full_cache(self):
        out = run_eval("--context", "512", "--chunk", "16", "--max-windows",
                       "2", "--kv-cache-dtype", "f32", "--kv-policy",
                       "streaming:sinks=4,window=480;"
                       "streaming:sinks=4,window=128;"
                       "streaming:sinks=0,window=128", "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = json.loads(out.stdout)["policies"]
        self.assertEqual([r["kv_policy"] for r in rows],
                         ["streaming:sinks=4,window=480",
                          "streaming:sinks=4,window=128",
                          "streaming:sinks=0,window=128"])
        covering, sinks, no_sinks = rows
        self.assertEqual(covering["mean_kld"], 0.0)
        self.assertEqual(covering["top1_agreement_pct"], 100.0)
        self.assertGreater(sinks["mean_kld"], 0.0)
        self.assertLess(2 * sinks["mean_kld"], no_sinks["mean_kld"])
        self.assertGreater(sinks["top1_agreement_pct"],
                           no_sinks["top1_agreement_pct"])
        self.assertLessEqual(sinks["peak_kv_tokens"], 16 + 128 + 16)
        bad = run_eval("--kv-policy", "streaming:window=0", timeout=60)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--kv-policy", bad.stderr)

    def test_heavy_hitters_hold_their_budget_and_track_the_window(self):
        # heavy_hitters at the streaming window's peak KV (160 tokens): a
        # budget covering the context changes nothing; at 160 it diverges
        # about as much as the window and far less than a window without
        # sinks (measured 2026-12-06: KLD 0.104 vs 0.090 and 0.855; at
        # this small scale it trails the window, at 4K-8K it leads:
        # docs/PERFORMANCE.md). About 7 s.
        out = run_eval("--context", "512", "--chunk", "16", "--max-windows",
                       "2", "--kv-cache-dtype", "f32", "--kv-policy",
                       "heavy_hitters:sinks=4,window=64,budget=512;"
                       "heavy_hitters:sinks=4,window=64,budget=144;"
                       "streaming:sinks=4,window=128;"
                       "streaming:sinks=0,window=128", "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        rows = json.loads(out.stdout)["policies"]
        covering, hh, window, no_sinks = rows
        self.assertEqual(covering["mean_kld"], 0.0)
        self.assertGreater(hh["mean_kld"], 0.0)
        self.assertLessEqual(hh["peak_kv_tokens"], 144 + 16)
        self.assertLess(hh["mean_kld"], 1.5 * window["mean_kld"])
        self.assertLess(2 * hh["mean_kld"], no_sinks["mean_kld"])


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    if not os.path.exists(os.path.join(ARGS.source_dir, "weights", MODEL)):
        print(f"SKIP: weights/{MODEL} missing (run deploy/setup.sh)")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        Eval.tmp = tmp
        prog = unittest.main(argv=[sys.argv[0], *rest], exit=False,
                             verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
