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
request out. About 60 s.

    speculative_e2e_test.py --binary build/server/kvserve --source-dir .
"""
import json
import os
import sys
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
        return [c["text"] for c in out["choices"]], out["usage"]
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
        self.assertEqual([opted_out["choices"][0]["text"]], self.want[0])
        self.assertEqual(opted_out["usage"]["kvserve"]["speculative"],
                         {"draft_tokens": 0, "accepted_tokens": 0})

    def test_batched_preempted_and_forked_outputs_unchanged(self):
        # 16 int8 blocks of 16 tokens (12,240 bytes a token): the four
        # requests need about 24, so they preempt each other (recompute)
        # while speculating.
        block = 12240 * 16
        server = Server("--speculative", "ngram", "--speculative-max-batch",
                        "64", "--kv-cache-bytes", str(16 * block),
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

    def test_int2_kv_rolls_its_staged_group_back(self):
        runs = []
        for mode in ("off", "ngram"):
            server = Server("--speculative", mode, "--kv-cache-dtype", "int2")
            try:
                runs.append([t for t, _ in texts(server)])
            finally:
                server.close()
        self.assertEqual(runs[1], runs[0])


def setup(args, pb, pb_grpc):
    global ARGS
    ARGS = args


if __name__ == "__main__":
    sys.exit(run_unittests(__doc__, setup))
