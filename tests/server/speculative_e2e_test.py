#!/usr/bin/env python3
"""--speculative ngram end to end through the real binary: outputs are
those of decoding without speculation, greedy and seeded sampling alike.

One daemon without speculation answers a set of completions (prompts the
default model copies from, so prompt-lookup drafts are accepted, and
open-ended ones); daemons with --speculative ngram must answer the same
text token for token: alone (batch 1), all at once with
--speculative-max-batch 64 (drafts verified beside other sequences' tokens
in one forward), under a KV budget so small that requests are preempted,
with int2 KV (whose newest key group is staged and rolls back too), and for
n = 2 completions. Drafts must actually be accepted (the metrics and
usage.kvserve.speculative say how many), and "speculative": false opts a
request out; a stop string, logprobs and min_tokens act inside accepted
runs as without them. --speculative draft is held to the same outputs with two
draft models: the target's own file (whose drafts are nearly all accepted;
alone and batched, preempted and forked) and a random-weight one-layer
model with the same tokenizer (tools/make_synthetic_gguf.py), whose drafts
are rejected; a draft whose tokenizer differs by one token, or a flag
without its partner, is refused at start-up, naming the flag. About 25 s.

    speculative_e2e_test.py --binary build/server/kvserve --source-dir .
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvserve_process import (KvserveProcess, counter,  # noqa: E402
                             run_concurrently, run_unittests)

ARGS = None
PASSAGE = ("The quick brown fox jumps over the lazy dog. The five boxing "
           "wizards jump quickly. Pack my box with five dozen liquor jugs. "
           "How vexingly quick daft zebras jump.")
PROMPTS = [
    ("copy", f"Copy the following text exactly.\nText: {PASSAGE}\nCopy:",
     {"temperature": 0}),
    ("list", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,",
     {"temperature": 0}),
    ("open", "Once upon a time, in a small village by the sea,",
     {"temperature": 0}),
    ("sampled", f"Repeat after me: {PASSAGE}\nAgain:",
     {"temperature": 0.8, "seed": 7}),
    # A stop string and logprobs inside an accepted run; min_tokens past
    # the point where the answer would end.
    ("stop+logprobs", f"Copy the following text exactly.\nText: {PASSAGE}\n"
     "Copy:", {"temperature": 0, "stop": ["boxing"], "logprobs": 2}),
    ("min_tokens", "Q: What is 2 + 2?\nA:",
     {"temperature": 0, "min_tokens": 40, "stop": ["\n"]}),
]
MAX_TOKENS = 48


class Server(KvserveProcess):
    def __init__(self, *extra):
        # The KV invariants checked after every step (rollback included).
        super().__init__(ARGS.binary, ARGS.source_dir, "--threads", "2",
                         "--kv-cache-bytes", "64MiB", "--kv-debug-invariants",
                         *extra)

    def complete(self, prompt, sampling, **extra):
        if not hasattr(self, "model"):
            url = f"http://127.0.0.1:{self.http_port}/v1/models"
            with urllib.request.urlopen(url, timeout=30) as r:
                self.model = json.loads(r.read())["data"][0]["id"]
        body = {"model": self.model, "prompt": prompt, "max_tokens": MAX_TOKENS,
                **sampling, **extra}
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            return json.loads(r.read())

    def close(self):
        self.terminate()


def texts(server, parallel=False, **extra):
    def one(item):
        _, prompt, sampling = item
        out = server.complete(prompt, sampling, **extra)
        # The text, and the logprobs where asked, must be equal.
        return [c["text"] + json.dumps(c.get("logprobs"), sort_keys=True)
                for c in out["choices"]], out["usage"]
    if parallel:
        return run_concurrently(one, PROMPTS)
    return [one(p) for p in PROMPTS]


class SpeculativeDecoding(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        base = Server()
        try:
            cls.want = [t for t, _ in texts(base)]
            cls.want_n2 = base.complete(PROMPTS[3][1], PROMPTS[3][2], n=2)
        finally:
            base.close()

    def check(self, got):
        for (name, _, _), w, (g, _) in zip(PROMPTS, self.want, got):
            self.assertEqual(g, w, name)

    def test_batch_one_outputs_unchanged_and_drafts_accepted(self):
        server = Server("--speculative", "ngram")
        try:
            got = texts(server)
            m = server.metrics()
            opted_out = server.complete(PROMPTS[0][1], PROMPTS[0][2],
                                        speculative=False)
        finally:
            server.close()
        self.check(got)
        accepted = counter(m, "kvserve_spec_decode_accepted_tokens_total")
        drafted = counter(m, "kvserve_spec_decode_draft_tokens_total")
        self.assertGreater(accepted, MAX_TOKENS / 2, m)
        self.assertGreaterEqual(drafted, accepted)
        copy_usage = got[0][1]["kvserve"]["speculative"]
        self.assertGreater(copy_usage["accepted_tokens"], 0, copy_usage)
        self.assertEqual([opted_out["choices"][0]["text"] + "null"],
                         self.want[0])
        self.assertEqual(opted_out["usage"]["kvserve"]["speculative"],
                         {"draft_tokens": 0, "accepted_tokens": 0})

    def check_batched_preempted_forked(self, *spec_flags):
        """All prompts at once and an n = 2 request under a pool so small
        that the requests preempt each other (recompute) while speculating:
        12 int8 blocks of 16 tokens (12,240 bytes a token) where the four
        need about 24."""
        block = 12240 * 16
        server = Server(*spec_flags, "--speculative-max-batch", "64",
                        "--kv-cache-bytes", str(12 * block),
                        "--swap-space-bytes", "0")
        try:
            got = texts(server, parallel=True)
            n2 = server.complete(PROMPTS[3][1], PROMPTS[3][2], n=2)
            m = server.metrics()
        finally:
            server.close()
        self.check(got)
        self.assertEqual([c["text"] for c in n2["choices"]],
                         [c["text"] for c in self.want_n2["choices"]])
        self.assertGreater(
            counter(m, "kvserve_spec_decode_accepted_tokens_total"), 0)
        preempted = counter(m, "kvserve_preemptions_total",
                            mode="recompute", reason="no_free_block")
        self.assertGreater(preempted, 0, "no preemption")

    def test_batched_preempted_and_forked_outputs_unchanged(self):
        self.check_batched_preempted_forked("--speculative", "ngram")

    def test_draft_model_outputs_unchanged(self):
        own = os.path.join(ARGS.source_dir, "weights",
                           "SmolLM2-135M-Instruct.Q4_1.gguf")
        server = Server("--speculative", "draft",
                        "--speculative-draft-model", own)
        try:
            got = texts(server)
            m = server.metrics()
        finally:
            server.close()
        self.check(got)
        # The target's own weights draft: all but a few drafts are accepted
        # (the draft's KV is fp16, the target's int8, so near ties may
        # differ).
        accepted = counter(m, "kvserve_spec_decode_accepted_tokens_total")
        drafted = counter(m, "kvserve_spec_decode_draft_tokens_total")
        self.assertGreater(accepted, MAX_TOKENS, m)
        self.assertGreaterEqual(accepted, 0.8 * drafted)
        self.assertGreater(
            counter(m, "kvserve_spec_decode_draft_model_seconds_total"), 0)
        self.assertEqual(
            counter(m, "kvserve_spec_decode_draft_failures_total"), 0)
        self.check_batched_preempted_forked(
            "--speculative", "draft", "--speculative-draft-model", own)

    def test_random_draft_changes_nothing(self):
        with tempfile.TemporaryDirectory() as tmp:
            tiny = synthetic_draft(tmp, "tiny.gguf")
            server = Server("--speculative", "draft",
                            "--speculative-draft-model", tiny,
                            "--speculative-draft-p-min", "0")
            try:
                got = texts(server)
                m = server.metrics()
            finally:
                server.close()
        self.check(got)
        drafted = counter(m, "kvserve_spec_decode_draft_tokens_total")
        accepted = counter(m, "kvserve_spec_decode_accepted_tokens_total")
        self.assertGreater(drafted, 0)
        self.assertLess(accepted, 0.2 * drafted, m)

    def test_bad_draft_flags_are_refused(self):
        own = os.path.join(ARGS.source_dir, "weights",
                           "SmolLM2-135M-Instruct.Q4_1.gguf")
        with tempfile.TemporaryDirectory() as tmp:
            swapped = synthetic_draft(tmp, "swapped.gguf", "100,101")
            cases = [
                (["--speculative", "draft"],
                 "--speculative draft: needs --speculative-draft-model"),
                (["--speculative-draft-model", own],
                 "--speculative-draft-model: needs --speculative draft"),
                (["--speculative", "draft", "--speculative-draft-model",
                  swapped], "token 100 differs from the target's"),
                (["--speculative", "draft", "--speculative-draft-model",
                  os.path.join(tmp, "absent.gguf")],
                 "--speculative-draft-model: model path"),
            ]
            for flags, want in cases:
                run = subprocess.run(
                    [ARGS.binary, "--model", own, "--port", "0",
                     "--metrics-port", "0", *flags],
                    capture_output=True, text=True, timeout=120)
                self.assertNotEqual(run.returncode, 0, flags)
                self.assertIn(want, run.stdout + run.stderr, flags)

    def test_int2_kv_rolls_its_staged_group_back(self):
        runs = []
        for mode in ("off", "ngram"):
            server = Server("--speculative", mode, "--kv-cache-dtype", "int2")
            try:
                runs.append([t for t, _ in texts(server)])
            finally:
                server.close()
        self.assertEqual(runs[1], runs[0])


def synthetic_draft(tmp, name, swap_tokens=None):
    """A one-layer random-weight model with the default model's tokenizer
    (or that tokenizer with two tokens exchanged), written to tmp/name."""
    out = os.path.join(tmp, name)
    cmd = [sys.executable,
           os.path.join(ARGS.source_dir, "tools", "make_synthetic_gguf.py"),
           "--out", out, "--hidden", "64", "--ffn", "128", "--layers", "1",
           "--heads", "2", "--kv-heads", "1"]
    if swap_tokens:
        cmd += ["--swap-tokens", swap_tokens]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return out


def setup(args, pb, pb_grpc):
    global ARGS
    ARGS = args


if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup))
