#!/usr/bin/env python3
"""Keeps tools/routing_bench.py working: a small fleet (2 simulated
replicas, no weights read), 4 tenants, 2 active-active pickers, every
policy once; its JSON checked for every policy and figure. One check is
about kvserve rather than the tool: the precise pickers, fed only by the
replicas' KV events (llm-d's speculative entries off), reach at least 90%
of the oracle's prefix hit rate with nothing lost (no timing is asserted: the figures are the benchmark's,
docs/PERFORMANCE.md).

    routing_bench_test.py --binary build/server/kvserve --source-dir .

Cost: 6 daemons on --device sim, about 30 s on 2 vCPUs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import unittest

ARGS = None
POLICIES = ("random", "approximate", "precise")


class RoutingBenchTest(unittest.TestCase):
    def test_small_fleet_reports_every_policy(self):
        tool = os.path.join(ARGS.source_dir, "tools", "routing_bench.py")
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "out.json")
            run = subprocess.run(
                [sys.executable, tool, "--binary", ARGS.binary,
                 "--replicas", "2", "--tenants", "4", "--prefix-tokens",
                 "512", "--requests", "40", "--rate", "20", "--pickers", "2",
                 "--speculative-ttl", "0", "--json", out_path],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(run.returncode, 0, run.stderr[-3000:])
            with open(out_path) as f:
                out = json.load(f)
        for policy in POLICIES:
            (r,) = out["runs"][policy]
            self.assertEqual(sum(r["requests_per_replica"].values()), 40)
            self.assertEqual(len(r["ttfts"]), 40)
            self.assertTrue(0 <= r["hit_rate"] <= r["oracle_hit_rate"] + 1e-9,
                            policy)
            self.assertEqual(sum(len(v) for v in r["tenants"].values()), 40)
            if policy != "random":
                self.assertEqual(len(r["trace"]), 40, policy)
        precise = out["runs"]["precise"][0]
        self.assertEqual(precise["events_dropped_by_replicas"], 0)
        self.assertEqual(precise["events_lost_before_the_index"], 0)
        self.assertGreaterEqual(
            precise["hit_rate"] / precise["oracle_hit_rate"], 0.9)
        for key in ("p90_random_over_precise",
                    "p90_approximate_over_precise"):
            self.assertGreater(out["summary"][key]["median"], 0, key)


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True)
    parser.add_argument("--source-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    model = os.path.join(ARGS.source_dir, "weights",
                         "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        print(f"SKIP: {model} missing (run deploy/setup.sh)")
        return 77
    prog = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
