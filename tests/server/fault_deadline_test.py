#!/usr/bin/env python3
"""Deadlines are enforced inside the scheduler (real kvserve binary).

A request whose gRPC deadline passes while it waits in the queue never
reaches the model (kvserve_prompt_tokens_total does not grow for it) and
counts as kvserve_deadline_exceeded_total{phase="queued"}; one whose
deadline passes while it runs is stopped, its KV blocks are freed, and it
counts as phase="running".

    fault_deadline_test.py --binary build/server/kvserve --source-dir .

Exits 77 (ctest: skipped) when grpcio or grpcio-tools is missing.
"""

import sys
import unittest

import fault_util as fu

QUEUED = 'kvserve_deadline_exceeded_total{phase="queued"}'
RUNNING_PHASE = 'kvserve_deadline_exceeded_total{phase="running"}'
PROMPT_TOKENS = "kvserve_prompt_tokens_total"


class DeadlineTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # One running request at a time, so a second one must queue; every
        # step takes at least 4 ms, so 480 tokens take at least 1.9 s
        # however fast the machine.
        cls.server = fu.Server("--max-num-seqs", "1", "--max-model-len",
                               "512", "--kv-cache-bytes", "64MiB",
                               "--fault-step-delay-ms", "4")
        cls.channel = cls.server.channel()
        cls.stub = fu.PB_GRPC.KvServeStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        cls.server.kill()

    def expect_deadline(self, call):
        """Reads `call` to its end; returns the tokens it streamed."""
        import grpc
        tokens = 0
        with self.assertRaises(grpc.RpcError) as cm:
            for msg in call:
                tokens += len(msg.token_ids)
        self.assertEqual(cm.exception.code(),
                         grpc.StatusCode.DEADLINE_EXCEEDED)
        return tokens

    def test_deadline_in_queue_never_prefills(self):
        blocker = self.stub.Generate(fu.greedy("Tell me a long story.", 480),
                                     timeout=120)
        next(blocker)  # it runs, holding the only slot
        before = self.server.metrics()
        victim = self.stub.Generate(
            fu.greedy("A queued request whose deadline passes first. " * 8,
                      8), timeout=0.5)
        self.assertEqual(self.expect_deadline(victim), 0)
        m = self.server.wait_metrics(
            lambda m: m[QUEUED] == before[QUEUED] + 1)
        self.assertEqual(m[QUEUED], before[QUEUED] + 1)
        self.assertEqual(m[RUNNING_PHASE], before[RUNNING_PHASE])
        # The victim's prompt never reached the model.
        self.assertEqual(m[PROMPT_TOKENS], before[PROMPT_TOKENS])
        self.assertEqual(m[fu.RUNNING], 1)  # the blocker still runs
        self.assertEqual(fu.finished(m, "deadline"),
                         fu.finished(before, "deadline") + 1)
        blocker.cancel()
        m = self.server.wait_idle()
        self.assertEqual(m[fu.ACTIVE], 0)

    def test_deadline_while_running_stops_and_frees(self):
        before = self.server.metrics()
        # 480 steps of at least 4 ms cannot finish in 1 s: it runs past its
        # deadline after its first tokens.
        call = self.stub.Generate(fu.greedy("Count to one thousand:", 480),
                                  timeout=1.0)
        tokens = self.expect_deadline(call)
        m = self.server.wait_metrics(
            lambda m: m[RUNNING_PHASE] == before[RUNNING_PHASE] + 1 and
            m[fu.ACTIVE] == 0 and m[fu.RUNNING] == 0)
        self.assertGreater(tokens, 0)  # it was running
        self.assertLess(tokens, 480)  # and was stopped
        self.assertEqual(m[RUNNING_PHASE], before[RUNNING_PHASE] + 1)
        self.assertEqual(m[QUEUED], before[QUEUED])
        self.assertEqual(m[fu.ACTIVE], 0)
        self.assertEqual(m[fu.RUNNING], 0)
        # No further tokens after the stop.
        g = "kvserve_generation_tokens_total"
        self.assertEqual(self.server.metrics()[g], m[g])


if __name__ == "__main__":
    sys.exit(fu.main(__doc__))
